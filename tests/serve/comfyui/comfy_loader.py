"""Loading the node pack as ComfyUI does, and ComfyUI's progress and interrupt modules as small stand-ins.

ComfyUI's loader (nodes.py `load_custom_node`, 0.8.0) imports a custom_nodes/ folder by path:
`spec_from_file_location(name, folder/__init__.py)` with the folder's path as the module name (dots made
"_x_"; older releases used the folder's name), registers it in sys.modules under that name, executes it and
reads NODE_CLASS_MAPPINGS / NODE_DISPLAY_NAME_MAPPINGS. Its executor then calls
`getattr(node_class(), node_class.FUNCTION)(**inputs)`. The stand-ins keep the names and semantics of
comfy.utils.ProgressBar (update_absolute(value, total)) and comfy.model_management's interrupt flag
(processing_interrupted; throw_exception_if_processing_interrupted clears it and raises
InterruptProcessingException), so the pack's calls are the ones it makes inside ComfyUI."""
from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path

PACK = Path(__file__).resolve().parents[3] / "comfyui" / "meshdit_nodes"


def load_pack(path: Path = PACK) -> types.ModuleType:
    name = str(path).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unload_pack(pack: types.ModuleType) -> None:
    """Forgets the pack and its submodules, so the next load_pack executes it afresh."""
    for name in [n for n in sys.modules if n == pack.__name__ or n.startswith(pack.__name__ + ".")]:
        del sys.modules[name]


def run_node(pack: types.ModuleType, name: str, **inputs):
    node_class = pack.NODE_CLASS_MAPPINGS[name]
    node = node_class()
    outputs = getattr(node, node_class.FUNCTION)(**inputs)
    assert isinstance(outputs, tuple) and len(outputs) == len(node_class.RETURN_TYPES), (name, outputs)
    return node, outputs


class InterruptProcessingException(Exception):
    pass


class ComfyStandIn:
    """comfy, comfy.utils and comfy.model_management as modules; `bars` records every update."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.flag = False
        self.bars: list[list[tuple[float, float]]] = []
        self.on_update = None  # called with (value, total) after each update: a test can interrupt from it
        stand_in = self

        class ProgressBar:
            def __init__(self, total, node_id=None) -> None:
                self.total, self.current, self.updates = total, 0, []
                stand_in.bars.append(self.updates)

            def update_absolute(self, value, total=None, preview=None) -> None:
                if total is not None:
                    self.total = total
                self.current = min(value, self.total)
                self.updates.append((self.current, self.total))
                if stand_in.on_update:
                    stand_in.on_update(self.current, self.total)

        self.comfy = types.ModuleType("comfy")
        self.utils = types.ModuleType("comfy.utils")
        self.utils.ProgressBar = ProgressBar
        self.model_management = types.ModuleType("comfy.model_management")
        self.model_management.InterruptProcessingException = InterruptProcessingException
        self.model_management.interrupt_current_processing = self.interrupt
        self.model_management.processing_interrupted = self.interrupted
        self.model_management.throw_exception_if_processing_interrupted = self.throw_if_interrupted
        self.comfy.utils, self.comfy.model_management = self.utils, self.model_management

    def modules(self) -> dict:
        return {"comfy": self.comfy, "comfy.utils": self.utils, "comfy.model_management": self.model_management}

    def interrupt(self, value: bool = True) -> None:
        with self.lock:
            self.flag = value

    def interrupted(self) -> bool:
        with self.lock:
            return self.flag

    def throw_if_interrupted(self) -> None:
        with self.lock:
            if self.flag:
                self.flag = False
                raise InterruptProcessingException()


# ComfyUI's built-in nodes the example workflows use: their inputs and outputs as ComfyUI defines them
# (nodes.py: LoadImage, SaveImage, PreviewImage; comfy_extras/nodes_images.py: SaveAnimatedWEBP).
BUILTINS = {
    "LoadImage": {"required": {"image": ("STRING",)}, "outputs": ("IMAGE", "MASK")},
    "SaveImage": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING",)}, "outputs": ()},
    "PreviewImage": {"required": {"images": ("IMAGE",)}, "outputs": ()},
    "SaveAnimatedWEBP": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING",), "fps": ("FLOAT",),
                                      "lossless": ("BOOLEAN",), "quality": ("INT",),
                                      "method": (["default", "fastest", "slowest"],)}, "outputs": ()},
}


def is_link(value) -> bool:
    """API format: an input fed by another node is [node id, output index]."""
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def node_types(pack, class_type: str) -> tuple[dict, tuple]:
    """(inputs by name -> spec, output types) of a pack node or a built-in."""
    if class_type in pack.NODE_CLASS_MAPPINGS:
        node_class = pack.NODE_CLASS_MAPPINGS[class_type]
        types = node_class.INPUT_TYPES()
        return {**types["required"], **types.get("optional", {})}, node_class.RETURN_TYPES
    builtin = BUILTINS[class_type]
    return builtin["required"], builtin["outputs"]


def run_workflow(pack, workflow: dict, builtins: dict) -> dict:
    """Executes an API-format workflow as ComfyUI's executor does: each node once its linked inputs are
    computed, pack nodes through their FUNCTION, built-ins through `builtins[class_type](**inputs)`."""
    outputs: dict[str, tuple] = {}

    def compute(node_id: str) -> tuple:
        if node_id not in outputs:
            node = workflow[node_id]
            inputs = {name: compute(value[0])[value[1]] if is_link(value) else value
                      for name, value in node["inputs"].items()}
            if node["class_type"] in pack.NODE_CLASS_MAPPINGS:
                outputs[node_id] = run_node(pack, node["class_type"], **inputs)[1]
            else:
                outputs[node_id] = builtins[node["class_type"]](**inputs) or ()
        return outputs[node_id]

    for node_id in workflow:
        compute(node_id)
    return outputs
