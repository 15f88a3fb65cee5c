"""A settings field's command-line flag, declared on the field itself, so its name, xDiT's spellings and its
help text are written once: `meshdit.flags` builds the argparse flags from these, messages name the flag
through `flag_text`, and the field's documentation is the help text.

No torch here: the config dataclasses that use it are read before any rank starts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

_UNSET = object()


@dataclass(frozen=True)
class FlagSpec:
    name: str
    """kebab-case flag name without the dashes; its underscore spelling (xDiT's) is added by itself."""
    help: str
    """The help text, stating the default."""
    aliases: tuple[str, ...] = ()
    """Further spellings (without the dashes), e.g. xDiT's `use_fp8_gemms`."""
    argparse: dict = field(default_factory=dict)
    """What else argparse needs: type, action, choices, nargs, metavar."""
    cli_default: Any = _UNSET
    """The flag's default where it differs from the field's (e.g. --prompt: none, so --prompt-file can be alone)."""
    to_field: Callable[[Any], Any] | None = None
    """Flag value -> field value, where they differ (e.g. --no-kv-drift-correction -> kv_drift_correction False)."""
    switches: tuple[tuple[str, Any, str], ...] = ()
    """Further flags that take no value and set the field to a constant: (name, value, help), e.g. xDiT's
    --use-cfg-parallel (cfg degree 2)."""

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value in (`args.ulysses_degree`)."""
        return self.name.replace("-", "_")


def flagged(default: Any = dataclasses.MISSING, *, flag: str, help: str, aliases: tuple[str, ...] = (),
            cli_default: Any = _UNSET, to_field: Callable[[Any], Any] | None = None, switches: tuple = (),
            **argparse_kwargs) -> Any:
    """A dataclass field with a flag: `ulysses_degree: int = flagged(1, flag="ulysses-degree", help=..., type=int)`."""
    spec = FlagSpec(flag, help, tuple(aliases), argparse_kwargs, cli_default, to_field, tuple(switches))
    return field(default=default, metadata={"flag": spec})


def flag_specs(cls) -> list[tuple[dataclasses.Field, FlagSpec]]:
    """The fields of the dataclass `cls` that have a flag, in declaration order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def flag_text(cls, field_name: str) -> str:
    """How a message names the flag of `cls.field_name`: `--vae-tile-height`."""
    return "--" + next(spec.name for f, spec in flag_specs(cls) if f.name == field_name)


def cli_default(f: dataclasses.Field, spec: FlagSpec) -> Any:
    """The flag's default: the field's, unless the flag states its own."""
    return f.default if spec.cli_default is _UNSET else spec.cli_default
