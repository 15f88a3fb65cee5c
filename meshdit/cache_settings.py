"""Step-cache settings of one request (`--cache` and its options), checked before any rank starts.

No torch here: the CLI reads these before ranks start. What the methods do: docs/caching.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import ConfigError
from .flag_spec import flagged

METHODS = ("fbcache", "dbcache")

# Each method's defaults for the options a request leaves unset (docs/caching.md, "Presets").
PRESETS = {
    "fbcache": dict(threshold=0.12, front_blocks=1, back_blocks=0, warmup=2, max_cached=3),
    "dbcache": dict(threshold=0.15, front_blocks=2, back_blocks=1, warmup=2, max_cached=3),
}
# Named presets (`--cache fast`): a method and values over its preset; options the request sets still win.
# fast: after 4 warmup steps, one step in four computes (the cap) unless the first block's change exceeds 0.6
# (docs/caching.md, "The default preset: fast").
NAMED_PRESETS = {
    "fast": ("fbcache", dict(threshold=0.6, warmup=4, max_cached=3)),
}
CHOICES = METHODS + tuple(NAMED_PRESETS)


@dataclass(frozen=True)
class CacheSettings:
    """How a request skips transformer blocks at steps whose input barely changed (DBCache, First-Block Cache).

    Unset (None) options take the method's preset (PRESETS). Frozen and hashable: requests whose settings differ
    never share a batch (Engine.generate_many, serve's batching key)."""

    method: str | None = flagged(
        None, flag="cache", choices=CHOICES, metavar="{fast,fbcache,dbcache}",
        help="step caching: skip the middle transformer blocks at steps whose input barely changed, reusing "
             "their last computed residual (lossy; docs/caching.md). fast: the default preset to use, fbcache "
             "with threshold 0.6, warmup 4, at most 3 cached steps in a row (about 2x, one step in four "
             "computed); fbcache: First-Block Cache (the first block runs and decides); dbcache: DBCache "
             "(--cache-fn front and --cache-bn back blocks always run) "
             "(default: none, every block runs at every step)")
    threshold: float | None = flagged(
        None, flag="cache-threshold", type=float, metavar="T",
        help="skip when the relative L1 change of the front blocks' residual since the last computed step is "
             "below T, >= 0; larger skips more and loses more; 0 never skips "
             f"(default: fast {NAMED_PRESETS['fast'][1]['threshold']}, fbcache {PRESETS['fbcache']['threshold']}, "
             f"dbcache {PRESETS['dbcache']['threshold']})")
    front_blocks: int | None = flagged(
        None, flag="cache-fn", type=int, metavar="F",
        help=f"DBCache: leading blocks that always run and give the change signal, >= 1 "
             f"(default: {PRESETS['dbcache']['front_blocks']}; fbcache: 1)")
    back_blocks: int | None = flagged(
        None, flag="cache-bn", type=int, metavar="B",
        help=f"DBCache: trailing blocks that always run, >= 0 (default: {PRESETS['dbcache']['back_blocks']}; "
             "fbcache: 0)")
    warmup: int | None = flagged(
        None, flag="cache-warmup", type=int, metavar="K",
        help=f"the first K steps always compute every block, >= 0 (default: fbcache "
             f"{PRESETS['fbcache']['warmup']}, dbcache {PRESETS['dbcache']['warmup']})")
    max_cached: int | None = flagged(
        None, flag="cache-max-cached", type=int, metavar="N",
        help=f"at most N cached steps in a row, then one computed step, >= 1 (default: "
             f"{PRESETS['fbcache']['max_cached']})")
    compute_steps: tuple[int, ...] = flagged(
        (), flag="cache-compute-steps", type=int, nargs="+", metavar="STEP", to_field=lambda v: tuple(v or ()),
        help="static step mask: these steps (0-based) always compute every block (default: none)")
    taylorseer: int | None = flagged(
        None, flag="taylorseer", type=int, nargs="?", const=1, choices=(1, 2), metavar="ORDER",
        help="forecast the skipped blocks' residual with a Taylor series of ORDER 1 or 2 (finite differences over "
             "the computed steps) instead of reusing the last one; 1 when no ORDER is given (default: off)")

    @property
    def enabled(self) -> bool:
        return self.method is not None

    @property
    def base_method(self) -> str | None:
        """The method itself: a named preset's method (fast: fbcache), else `method`."""
        return NAMED_PRESETS[self.method][0] if self.method in NAMED_PRESETS else self.method

    def resolved(self) -> "CacheSettings":
        """A copy with every unset option taken from the preset (a named preset's values over its method's; fbcache:
        1 front block, 0 back) and `method` the method itself."""
        if not self.enabled:
            return self
        preset = dict(PRESETS[self.base_method], **(NAMED_PRESETS[self.method][1] if self.method in NAMED_PRESETS
                                                    else {}))
        values = {k: getattr(self, k) if getattr(self, k) is not None else v for k, v in preset.items()}
        return replace(self, method=self.base_method, **values)

    def validate(self) -> None:
        """Checks that need no model; each message names the flag and the fix."""
        if self.method is None:
            given = [flag for flag, value in (("--cache-threshold", self.threshold), ("--cache-fn", self.front_blocks),
                                              ("--cache-bn", self.back_blocks), ("--cache-warmup", self.warmup),
                                              ("--cache-max-cached", self.max_cached),
                                              ("--taylorseer", self.taylorseer)) if value is not None]
            if self.compute_steps:
                given.append("--cache-compute-steps")
            if given:
                raise ConfigError(f"{', '.join(given)} set(s) an option of step caching, which is off: add "
                                  "--cache dbcache (or fbcache), or drop the option.")
            return
        if self.method not in CHOICES:
            raise ConfigError(f"--cache {self.method!r} is neither a cache method nor a preset: use --cache fast (the "
                              "preset), --cache fbcache or --cache dbcache.")
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
            raise ConfigError(f"--cache-threshold must be a finite number >= 0, got {t!r}: use e.g. "
                              "--cache-threshold 0.08 (0 never skips).")
        if self.base_method == "fbcache":
            for flag, value, wanted in (("--cache-fn", self.front_blocks, 1), ("--cache-bn", self.back_blocks, 0)):
                if value is not None and value != wanted:
                    raise ConfigError(f"{flag} {value} does not apply to --cache {self.method} (First-Block Cache "
                                      f"is {flag} {wanted}): use --cache dbcache {flag} {value}, or drop {flag}.")
        for flag, value, low in (("--cache-fn", self.front_blocks, 1), ("--cache-bn", self.back_blocks, 0),
                                 ("--cache-warmup", self.warmup, 0), ("--cache-max-cached", self.max_cached, 1)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise ConfigError(f"{flag} must be a whole number >= {low}, got {value!r}: use {flag} {low} or more.")
        if self.taylorseer is not None and self.taylorseer not in (1, 2):
            raise ConfigError(f"--taylorseer takes order 1 or 2, got {self.taylorseer!r}: use --taylorseer 1.")
        for step in self.compute_steps:
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise ConfigError(f"--cache-compute-steps takes step numbers >= 0 (0 is the first step), got "
                                  f"{step!r}.")

    def check_blocks(self, num_blocks: int) -> None:
        """The front and back blocks must leave at least one block to skip among the transformer's `num_blocks`."""
        if not self.enabled:
            return
        r = self.resolved()
        if r.front_blocks + r.back_blocks >= num_blocks:
            raise ConfigError(
                f"--cache-fn {r.front_blocks} + --cache-bn {r.back_blocks} leave none of this transformer's "
                f"{num_blocks} blocks to skip: use --cache-fn and --cache-bn that add up to at most "
                f"{num_blocks - 1}.")


def transformer_block_count(transformer_config: dict) -> int | None:
    """Blocks of a diffusers transformer from its config (FLUX.1: num_layers + num_single_layers); None if unknown."""
    count = sum(int(transformer_config.get(k) or 0) for k in ("num_layers", "num_single_layers"))
    return count or None
