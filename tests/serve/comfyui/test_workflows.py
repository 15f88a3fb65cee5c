"""The example workflows (comfyui/workflows/*.json, ComfyUI's API format) parse, name only the pack's nodes
and the ComfyUI built-ins listed in comfy_loader.BUILTINS, give every required input, link outputs that
exist to inputs of the same type, and keep widget values within the inputs' choices and bounds; together
they use every node of the pack."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshdit.distributed.ports import free_port

from .comfy_loader import BUILTINS, is_link, load_pack, node_types, unload_pack

WORKFLOWS = sorted((Path(__file__).resolve().parents[3] / "comfyui" / "workflows").glob("*.json"))


@pytest.fixture(scope="module")
def pack():
    with pytest.MonkeyPatch.context() as patch:  # no server: the LoRA name is free text
        patch.setenv("MESHDIT_URL", f"http://127.0.0.1:{free_port()}")
        module = load_pack()
        yield module
        unload_pack(module)


def check_widget(spec: tuple, value, where: str) -> None:
    kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
    if isinstance(kind, list):
        assert value in kind, f"{where}: {value!r} is not one of {kind}"
    elif kind in ("INT", "FLOAT"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
        assert kind == "FLOAT" or isinstance(value, int), where
        assert options.get("min", value) <= value <= options.get("max", value), f"{where}: {value} out of bounds"
    elif kind == "STRING":
        assert isinstance(value, str), where
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), where
    else:
        raise AssertionError(f"{where}: a {kind} input must be linked, not given {value!r}")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid_for_the_pack_and_comfyui_builtins(pack, path):
    workflow = json.loads(path.read_text())
    assert workflow and all(isinstance(node, dict) and "class_type" in node for node in workflow.values())
    for node_id, node in workflow.items():
        where = f"{path.name} node {node_id} ({node['class_type']})"
        assert node["class_type"] in pack.NODE_CLASS_MAPPINGS or node["class_type"] in BUILTINS, where
        inputs, _ = node_types(pack, node["class_type"])
        required = (pack.NODE_CLASS_MAPPINGS[node["class_type"]].INPUT_TYPES()["required"]
                    if node["class_type"] in pack.NODE_CLASS_MAPPINGS else inputs)
        assert set(required) <= set(node["inputs"]), f"{where}: missing {set(required) - set(node['inputs'])}"
        for name, value in node["inputs"].items():
            assert name in inputs, f"{where}: no input {name!r}"
            if is_link(value):
                source = workflow[value[0]]
                produced = node_types(pack, source["class_type"])[1]
                assert value[1] < len(produced), f"{where}.{name}: output {value[1]} of node {value[0]}"
                assert produced[value[1]] == inputs[name][0], f"{where}.{name}: {produced[value[1]]} is not " \
                                                              f"{inputs[name][0]}"
            else:
                check_widget(inputs[name], value, f"{where}.{name}")
    assert any(node["class_type"] in ("SaveImage", "PreviewImage", "SaveAnimatedWEBP")
               for node in workflow.values()), f"{path.name}: no output node, ComfyUI would run nothing"


def test_the_workflows_use_every_node_of_the_pack(pack):
    used = {node["class_type"] for path in WORKFLOWS for node in json.loads(path.read_text()).values()}
    assert set(pack.NODE_CLASS_MAPPINGS) <= used, set(pack.NODE_CLASS_MAPPINGS) - used
    assert used - set(pack.NODE_CLASS_MAPPINGS) <= set(BUILTINS)
