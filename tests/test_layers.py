"""Layers that point down: every import inside meshdit/ goes to the importer's own layer or a lower one.

LAYERS is the one statement of the order (docs/ARCHITECTURE.md's "Layers" lists the same, checked below).
Every module of meshdit/ is read with `ast`: module-level and function-level imports, relative and absolute
(`from . import x` counts as importing the submodule x where there is one). A module belongs to the layer of
the longest entry naming it or a package above it ("vae.settings" before "vae"); a module no entry names
fails the test, so a new subpackage gets its place in the order when it is added. Within one layer the
subpackages import one another without a cycle. Names a package's `__getattr__` imports lazily (lazy.py)
are not imports and are not checked.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "meshdit"

# Bottom first. Entries are module paths inside meshdit ("" is meshdit/__init__.py, the API facade).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "lazy", "logs", "flag_spec", "memory", "output", "preflight", "prompt_vocabulary",
                    "input_image", "default_model", "phases")),
    ("settings", ("config", "config_files", "lora_files", "flags", "models.registry", "models.info", "vae.settings",
                  "quant.settings", "loading.options", "engine_settings", "request",
                  "request_cost", "cache_settings", "planner", "models.record", "models.records", "mesh_axes")),
    ("distributed", ("distributed", "rank_errors")),
    ("quant", ("quant",)),
    ("attention", ("attention",)),
    ("parallel", ("parallel",)),
    ("denoising, vae, cache", ("denoising", "vae", "cache", "rl")),
    ("models", ("models",)),
    ("combine, loading", ("combine", "loading")),
    ("engine", ("engine", "pipe_native")),
    ("runner", ("runner", "rank", "prelaunch", "rollouts")),
    ("entry points", ("", "__main__", "cli", "serve", "testing", "planner.command", "planner.calibrate",
                      "rollouts.example")),
)
# The settings layer is what the checks before any rank starts read: importing it must not import torch.
TORCH_FREE_LAYER = "settings"


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    source: str  # the importing module, e.g. "meshdit.vae.settings"
    target: str  # the imported module, e.g. "meshdit.models.info"


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `package` (a package is named by its __init__.py)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = (package.name, *path.relative_to(package).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(package: Path) -> list[Import]:
    """Every import of a module of `package` by a module of `package`, wherever in the file it stands."""
    modules = module_names(package)
    found = []
    for source, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(source, is_package, node.level, node.module)
                # `from pkg import name`: the submodule pkg.name where there is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found += [Import(path, node.lineno, source, t) for t in dict.fromkeys(targets)
                      if t == package.name or t.startswith(package.name + ".")]
    return found


def _resolve(source: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    parts = source.split(".")
    if not is_package:
        parts = parts[:-1]  # a plain module's relative imports start at its package
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def layer_of(module: str, package: str, layers=LAYERS) -> int | None:
    """Index in `layers` of the longest entry naming `module` or a package above it; None if none does."""
    inner = module[len(package) + 1:] if module != package else ""
    best, best_len = None, -1
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if (entry == "" and inner == "") or (entry and (inner == entry or inner.startswith(entry + "."))):
                if len(entry) > best_len:
                    best, best_len = index, len(entry)
    return best


def layer_violations(package: Path, layers=LAYERS) -> list[str]:
    """What breaks the order: modules with no layer, imports pointing up, cycles between subpackages of a layer."""
    name = package.name
    problems = [f"{path.relative_to(package.parent)}: module {module} has no layer; add it to LAYERS "
                f"(tests/test_layers.py) and docs/ARCHITECTURE.md's Layers"
                for module, path in module_names(package).items() if layer_of(module, name, layers) is None]
    if problems:
        return problems
    within: dict[int, dict[str, dict[str, Import]]] = {}  # layer -> subpackage -> subpackage it imports -> why
    for imp in imports(package):
        low, high = layer_of(imp.source, name, layers), layer_of(imp.target, name, layers)
        where = f"{imp.path.relative_to(package.parent)}:{imp.line}"
        if high > low:
            problems.append(f"{where}: {imp.source} (layer {layers[low][0]!r}) imports {imp.target} "
                            f"(layer {layers[high][0]!r}, higher)")
        elif high == low:
            a, b = _subpackage(imp.source, name), _subpackage(imp.target, name)
            if a != b:
                within.setdefault(low, {}).setdefault(a, {}).setdefault(b, imp)
    for layer, graph in within.items():
        for cycle in _cycles(graph):
            steps = ", ".join(f"{graph[a][b].path.relative_to(package.parent)}:{graph[a][b].line} "
                              f"({graph[a][b].source} -> {graph[a][b].target})" for a, b in zip(cycle, cycle[1:]))
            problems.append(f"import cycle inside layer {layers[layer][0]!r}: {' -> '.join(cycle)} ({steps})")
    return problems


def _subpackage(module: str, package: str) -> str:
    inner = module[len(package) + 1:] if module != package else ""
    return inner.split(".")[0] if inner else "(meshdit)"


def _cycles(graph: dict[str, dict]) -> list[list[str]]:
    """One cycle (as a closed walk [a, ..., a]) per strongly connected group of more than one node."""
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        path, seen = [start], {start}
        stack = [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                seen.discard(path.pop())
            elif nxt == start:
                cycles.append(path + [start])
                done.update(path)
                break
            elif nxt not in seen and nxt not in done:
                path.append(nxt)
                seen.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
        done.add(start)
    return cycles


def folder_cycles(package: Path) -> list[str]:
    """Import cycles between folders: each subpackage of `package` is one node (vae/, cache/, ...) and each of its
    top-level modules another (config.py, ...). Layers allow a settings module inside a package above them
    (vae/settings.py); this graph does not, so a folder is never both above and below another."""
    name = package.name

    def node(module: str) -> str:
        inner = module[len(name) + 1:].split(".") if module != name else ["__init__"]
        return inner[0] + "/" if (package / inner[0]).is_dir() else inner[0]

    graph: dict[str, dict[str, Import]] = {}
    for imp in imports(package):
        a, b = node(imp.source), node(imp.target)
        if a != b:
            graph.setdefault(a, {}).setdefault(b, imp)
    return [" -> ".join(cycle) + " (" + ", ".join(
        f"{graph[a][b].path.relative_to(package.parent)}:{graph[a][b].line}" for a, b in zip(cycle, cycle[1:])) + ")"
        for cycle in _cycles(graph)]


def test_folder_imports_form_no_cycle():
    cycles = folder_cycles(PACKAGE)
    assert not cycles, "folder-level import cycles:\n" + "\n".join(cycles)


def test_imports_point_down():
    problems = layer_violations(PACKAGE)
    assert not problems, "layer order broken (tests/test_layers.py LAYERS):\n" + "\n".join(problems)


def test_every_layer_entry_exists():
    """An entry naming nothing (a module moved or renamed) would hide where its code went."""
    names = {m[len("meshdit."):] if m != "meshdit" else "" for m in module_names(PACKAGE)}
    missing = [e for _, entries in LAYERS for e in entries
               if e not in names and not any(n.startswith(e + ".") for n in names)]
    assert not missing, f"LAYERS names modules that do not exist: {missing}"


def test_architecture_lists_the_same_order():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^(\d+)\. \*\*(.+?)\*\*: (.+)$", section, re.MULTILINE)
    documented = [(name, tuple(e.strip().strip("`") for e in entries.split(","))) for _, name, entries in listed]
    expected = [(name, tuple(e or "meshdit/__init__" for e in entries)) for name, entries in LAYERS]
    assert documented == expected, "docs/ARCHITECTURE.md's layer list differs from LAYERS (tests/test_layers.py)"


def test_settings_layer_imports_no_torch():
    modules = [f"meshdit.{e}" for name, entries in LAYERS if name == TORCH_FREE_LAYER for e in entries]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(sorted(m for m in ('torch', 'diffusers') " \
           "if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the settings layer imports {out.stdout.strip()} ({modules})"


# The checker's own negative cases: a copy of meshdit/ with one reverse import added must be reported.

def _copy_package(tmp_path: Path) -> Path:
    copy = tmp_path / "meshdit"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert layer_violations(copy) == []  # the copy is as clean as the original
    return copy


@pytest.mark.parametrize("file, added, layers", [
    # two of the reverse imports there were before combine/ existed
    ("quant/codec.py", "from ..attention.usp import WireCodecs", ("quant", "attention")),
    ("parallel/sequence.py", "from meshdit.denoising.loop import denoise", ("parallel", "denoising, vae, cache")),
    ("denoising/loop.py", "    from meshdit.combine import parallelized\n", ("denoising, vae, cache", "combine, loading")),
], ids=["module-level-relative", "module-level-absolute", "function-level"])
def test_a_reverse_import_is_reported(tmp_path, file, added, layers):
    copy = _copy_package(tmp_path)
    path = copy / file
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if added.startswith("    "):  # first thing in the first function's body
        index = next(i for i, line in enumerate(lines) if line.startswith("def ") and line.rstrip().endswith(":")) + 1
    else:  # before the first import after `from __future__`
        index = next(i for i, line in enumerate(lines)
                     if line.startswith(("from ", "import ")) and "__future__" not in line)
    lines.insert(index, added if added.endswith("\n") else added + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    problems = layer_violations(copy)
    assert len(problems) == 1, problems
    low, high = layers
    assert problems[0].startswith(f"meshdit/{file}:{index + 1}: ") and f"(layer {low!r})" in problems[0] \
        and f"(layer {high!r}, higher)" in problems[0], problems[0]


def test_a_cycle_inside_a_layer_is_reported(tmp_path):
    """The import circle there was: vae/settings.py read config files through models/info.py, which imports
    vae/settings.py (both in the settings layer, so no import points up; the cycle is what is wrong)."""
    copy = _copy_package(tmp_path)
    path = copy / "vae" / "settings.py"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith("def check_vae_of_model")) + 1
    lines.insert(index, "    from ..models.info import ModelInfo\n")
    path.write_text("".join(lines), encoding="utf-8")
    problems = layer_violations(copy)
    assert len(problems) == 1 and problems[0].startswith("import cycle inside layer 'settings': ") \
        and f"meshdit/vae/settings.py:{index + 1}" in problems[0] and "meshdit/models/info.py:" in problems[0], \
        problems


def test_a_module_without_a_layer_is_reported(tmp_path):
    copy = _copy_package(tmp_path)
    (copy / "newpackage").mkdir()
    (copy / "newpackage" / "__init__.py").write_text("")
    problems = layer_violations(copy)
    assert problems and all("newpackage" in p and "has no layer" in p for p in problems), problems


def test_test_folders_mirror_the_subpackages():
    """tests/ mirrors meshdit/: a folder of tests is named after the subpackage it tests (tests of top-level
    modules stay at the top), so a new subpackage's tests have one obvious place."""
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in (PACKAGE.parent / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= subpackages, f"tests/ folders with no meshdit/ subpackage: {sorted(folders - subpackages)}"


def test_a_folder_cycle_is_reported(tmp_path):
    """The folder cycle there was: config.py imported cache/settings.py while cache/ imports distributed/, which
    imports config.py."""
    copy = _copy_package(tmp_path)
    assert folder_cycles(copy) == []
    path = copy / "config.py"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("from .errors import", "from .cache.run import CacheReport\nfrom .errors import", 1),
                    encoding="utf-8")
    cycles = folder_cycles(copy)
    assert len(cycles) == 1 and "config -> cache/" in cycles[0] and "meshdit/config.py:" in cycles[0], cycles
