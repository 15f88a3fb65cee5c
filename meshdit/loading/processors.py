"""Pipeline components transformers cannot load here as saved, loaded another way and passed to from_pretrained."""
from __future__ import annotations

import os

from ..config_files import read_json
from ..models.qwen_vl_processor import PROCESSOR_CLASS, image_only_processor_from_folder


def processor_substitutes(model: str) -> dict:
    """{component: processor} for from_pretrained: without torchvision, each Qwen2VLProcessor of the pipeline
    (Qwen-Image-Edit's `processor`) built from its folder without the video processor transformers 5 would load
    (and fail on); with torchvision, or without such a component, nothing (from_pretrained loads them itself)."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return {}
    names = [name for name, entry in read_json(model, "model_index.json").items()
             if entry == ["transformers", PROCESSOR_CLASS]]
    if not names:
        return {}
    if os.path.isdir(model):
        folder = model
    else:  # a Hub id: the processors' folders only (from_pretrained fetches the rest into the same cache)
        from huggingface_hub import snapshot_download

        folder = snapshot_download(model, allow_patterns=[f"{name}/*" for name in names])
    return {name: image_only_processor_from_folder(os.path.join(folder, name)) for name in names}
