"""Built-in config snapshots of large models, so `meshdit plan` works offline (docs/planner.md names their
sources): each is a folder with model_index.json, transformer/ and vae/ configs (only the fields the checks and the
cost model read) and planner.json (the Hub id and the text encoders' config fields)."""
from __future__ import annotations

import json
import os

SNAPSHOT_DIR = os.path.join(os.path.dirname(__file__), "snapshots")


def snapshot_names() -> tuple[str, ...]:
    return tuple(sorted(n for n in os.listdir(SNAPSHOT_DIR) if os.path.isdir(os.path.join(SNAPSHOT_DIR, n))))


def _hub_ids() -> dict[str, str]:
    out = {}
    for name in snapshot_names():
        with open(os.path.join(SNAPSHOT_DIR, name, "planner.json"), encoding="utf-8") as f:
            out[json.load(f)["hub_id"].lower()] = name
    return out


def resolve_model(model: str | None) -> str:
    """A folder for `model`: a snapshot's name or its Hub id -> the snapshot; None -> the bundled model; anything
    else unchanged (a folder, or a Hub id read through config_files)."""
    if model is None:
        from ..default_model import weights_path

        return str(weights_path())
    if os.path.isdir(model):
        return model
    name = model if model in snapshot_names() else _hub_ids().get(model.lower())
    return os.path.join(SNAPSHOT_DIR, name) if name else model
