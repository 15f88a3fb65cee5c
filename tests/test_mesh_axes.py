"""The axis table (meshdit/mesh_axes.py) is the one home of the mesh axes: ParallelConfig's degree fields, the
flags, the DeviceMesh's dims and derived groups and the planner's layouts all come from its rows, and no module
outside it names an axis by a string in a mesh lookup."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from meshdit.config import ParallelConfig
from meshdit.errors import ConfigError
from meshdit.flag_spec import flag_specs
from meshdit.flags import FlagParser, add_layout_flags, layout_from_args
from meshdit.mesh_axes import AXES, DERIVED_GROUPS, MESH_AXES, MeshAxis, axis
from meshdit.planner.layouts import Layout, degree_tuples

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("meshdit", "tests", "benchmarks")
TABLE = ROOT / "meshdit" / "mesh_axes.py"

LOOKUPS = {"group", "size", "local_rank", "degree", "group_size", "get_group", "get_local_rank", "_axis", "_flatten"}
"""Methods that take a mesh axis: ParallelMesh's and SingleProcessMesh's, DeviceMesh's, the planner's Layout's."""
AXIS_NAMES = {a.value for a in MeshAxis}


def string_axis_lookups(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place that spells a mesh axis as a string literal where an axis is looked up: a lookup
    method's argument (`mesh.group("pp")`, `layout.degree("tp")`), a mesh subscript (`mesh["dp"]`), DeviceMesh's
    `mesh_dim_names=("dp", ...)`, or `MeshAxis("pp")`."""
    def named(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in AXIS_NAMES

    def spelled(node) -> bool:  # "pp", or ("ring", "ulysses")
        return named(node) or isinstance(node, (ast.Tuple, ast.List)) and any(named(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            method = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if (method in LOOKUPS or method == "MeshAxis") and node.args and spelled(node.args[0]):
                found.append(node)
            found += [node for k in node.keywords if k.arg == "mesh_dim_names" and spelled(k.value)]
        elif isinstance(node, ast.Subscript) and "mesh" in ast.unparse(node.value).lower() and spelled(node.slice):
            found.append(node)
    return sorted((n.lineno, ast.unparse(n)) for n in found)


def test_the_lookup_scan_finds_string_axes_and_passes_members():
    """The negative case: every spelling of a string lookup is found; members, other strings and other calls are not."""
    bad = '''
mesh.group("pp")
self.mesh.size('dp')
mesh.local_rank("ulysses")
layout.degree("tp")
mesh.mesh["ring"]
mesh[("ring", "ulysses")]._flatten("sp")
init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "cfg"))
MeshAxis("image")
'''
    assert [line for line, _ in string_axis_lookups(bad)] == [2, 3, 4, 5, 6, 7, 7, 8, 9]
    good = '''
mesh.group(MeshAxis.PP)
layout.degree(axis)
mesh.mesh[axis.value]
init_device_mesh("cpu", shape, mesh_dim_names=tuple(a.value for a in MESH_AXES))
request.size("large")
state.extra["image"]
group("other")
'''
    assert string_axis_lookups(good) == []


def test_no_module_outside_the_table_names_an_axis_by_a_string():
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == TABLE:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {code}"
                          for line, code in string_axis_lookups(path.read_text(encoding="utf-8"))]
    assert not offenders, "name the axis by its MeshAxis member (meshdit/mesh_axes.py):\n" + "\n".join(offenders)


def test_parallel_config_degree_fields_are_the_tables_rows_in_mesh_order():
    degree_fields = [(f, spec) for f, spec in flag_specs(ParallelConfig) if f.name != "compile"]
    assert [f.name for f, _ in degree_fields] == [a.field for a in AXES]
    for (f, spec), row in zip(degree_fields, AXES):
        assert (spec.name, spec.help, spec.switches, spec.argparse["metavar"]) == (
            row.flag, row.help, row.switches, row.metavar), row.name
        assert f.default == 1
    config = ParallelConfig(**{a.field: i + 2 for i, a in enumerate(AXES)})
    assert list(config.degrees) == list(MESH_AXES)
    assert list(config.degrees.values()) == list(range(2, len(AXES) + 2))
    assert {f.name for f in dataclasses.fields(ParallelConfig)} == {a.field for a in AXES} | {"compile"}


@pytest.mark.parametrize("row", AXES, ids=lambda a: a.name.value)
def test_each_rows_flag_sets_its_degree(row):
    """The row's flag, in both spellings, parses into its field and its mesh dim's degree; its switches too."""
    parser = FlagParser()
    add_layout_flags(parser)
    for spelling in (row.flag, row.flag.replace("-", "_")):
        config, _ = layout_from_args(parser.parse_args([f"--{spelling}", "3"]))
        assert getattr(config, row.field) == 3 and config.degrees[row.name] == 3
        assert all(d == 1 for a, d in config.degrees.items() if a != row.name)
    for switch, value, _ in row.switches:
        config, _ = layout_from_args(parser.parse_args([f"--{switch}"]))
        assert config.degrees[row.name] == value
    # the planner writes the same flag for a layout with this degree, and it reads back as the same layout
    layout = Layout(tuple((a, 2 if a == row.name else 1) for a in MESH_AXES))
    assert layout.flags() == f"--{row.flag} 2"
    config, _ = layout_from_args(parser.parse_args(layout.flags().split()))
    assert Layout.of(config) == layout


def test_validation_reads_each_rows_flag_and_bound():
    for row in AXES:
        with pytest.raises(ConfigError, match=f"^{row.flag_text} must be a whole number >= 1, got 0"):
            ParallelConfig(**{row.field: 0}).validate()
        if row.max_degree is not None:
            ParallelConfig(**{row.field: row.max_degree}).validate()
            with pytest.raises(ConfigError, match=f"use {row.flag_text} <= {row.max_degree}"):
                ParallelConfig(**{row.field: row.max_degree + 1}).validate()
            assert all(dict(t)[row.name] <= row.max_degree for t in degree_tuples(2 * row.max_degree))
    with pytest.raises(ConfigError, match=r"multiply to 4 \(dp=1 x cfg=2 x pp=1 x ring=1 x ulysses=2 x tp=1\)"):
        ParallelConfig(cfg_degree=2, ulysses_degree=2).validate(3)


def test_derived_groups_are_products_of_their_axes():
    config = ParallelConfig(**{a.field: i + 2 for i, a in enumerate(AXES)})
    layout = Layout.of(config)
    for group in DERIVED_GROUPS:
        assert list(group.axes) == [a for a in MESH_AXES if a in group.axes], "a group's axes are in mesh order"
        expected = 1
        for a in group.axes:
            expected *= config.degrees[a]
        assert config.group_size(group.name) == layout.group_size(group.name) == expected
    assert config.sp_degree == config.ring_degree * config.ulysses_degree == layout.sp
    assert layout.image_group == config.world_size // config.data_parallel_degree
    def groups_of(a):
        return [g.name for g in DERIVED_GROUPS if a in g.axes]
    assert groups_of(MeshAxis.RING) == [MeshAxis.SP, MeshAxis.IMAGE] and groups_of(MeshAxis.DP) == []
    with pytest.raises(KeyError):
        axis(MeshAxis.SP)  # a derived group has no degree of its own


def test_the_device_mesh_gets_the_tables_dims_and_derived_groups(monkeypatch):
    """ParallelMesh.build lays the DeviceMesh out as the table says (recorded, no process group needed)."""
    torch = pytest.importorskip("torch")
    from meshdit.distributed import mesh as mesh_module

    built = {}

    class Recorded:
        def __init__(self, dims):
            self.dims = dims

        def __getitem__(self, dims):
            return Recorded(dims)

        def _flatten(self, name):
            built.setdefault("flattened", []).append((name, self.dims))
            return Recorded((name,))

    def init_device_mesh(device_type, shape, mesh_dim_names):
        built.update(shape=shape, names=mesh_dim_names)
        return Recorded(mesh_dim_names)

    config = ParallelConfig(cfg_degree=2, ring_degree=3, tensor_parallel_degree=2)
    layout_degree = Layout.of(config).degree
    monkeypatch.setattr(mesh_module, "init_device_mesh", init_device_mesh)
    monkeypatch.setattr(mesh_module.dist, "get_world_size", lambda: config.world_size)
    mesh = mesh_module.ParallelMesh.build(config, torch.device("cpu"))
    assert built["names"] == tuple(a.value for a in MESH_AXES)
    assert built["shape"] == tuple(getattr(config, a.field) for a in AXES)
    assert built["flattened"] == [(g.name.value, tuple(a.value for a in g.axes)) for g in DERIVED_GROUPS]
    assert set(mesh.derived) == {g.name for g in DERIVED_GROUPS}
    for lookup in (mesh.size, mesh_module.SingleProcessMesh(torch.device("cpu")).size, layout_degree):
        with pytest.raises(ValueError, match="not a valid MeshAxis"):
            lookup("pipefusion")


def test_flags_named_in_messages_and_docs_are_the_tables():
    """Messages and docs still spell degree flags as text (`--ulysses-degree`): each must be a row's flag."""
    flags = {a.flag for a in AXES} | {a.flag.replace("-", "_") for a in AXES}
    texts = [p for p in (ROOT / "meshdit").rglob("*.py")] + [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    unknown = sorted({f"{p.relative_to(ROOT)}: --{m}" for p in texts
                      for m in re.findall(r"--([a-z_-]+[-_]degree)\b", p.read_text(encoding="utf-8"))
                      if m not in flags})
    assert not unknown, "a degree flag no row of meshdit/mesh_axes.AXES has:\n" + "\n".join(unknown)



def test_the_layouts_page_lists_the_tables_axes_and_a_row_per_flag():
    """docs/layouts.md names the axes in the mesh's order, and its method table has a row for each axis's flag."""
    page = (ROOT / "docs" / "layouts.md").read_text(encoding="utf-8")
    listed = re.search(r"A layout is a degree per mesh axis, `([a-z, ]+)`", page).group(1)
    assert listed.split(", ") == [a.value for a in MESH_AXES]
    method_rows = page.split("## What each method splits")[1].split("\n## ")[0]
    assert all(f"(`{a.flag_text} " in method_rows for a in AXES)
