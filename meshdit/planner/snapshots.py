"""Built-in config snapshots of large models, so `meshdit plan` works offline (docs/planner.md names their
sources): each is a folder with model_index.json, transformer/ and vae/ configs (only the fields the checks and the
cost model read) and planner.json (the Hub id and the text encoders' config fields)."""
from __future__ import annotations

import difflib
import json
import os

SNAPSHOT_DIR = os.path.join(os.path.dirname(__file__), "snapshots")


def snapshot_names() -> tuple[str, ...]:
    return tuple(sorted(n for n in os.listdir(SNAPSHOT_DIR) if os.path.isdir(os.path.join(SNAPSHOT_DIR, n))))


def _hub_id(name: str) -> str:
    with open(os.path.join(SNAPSHOT_DIR, name, "planner.json"), encoding="utf-8") as f:
        return json.load(f)["hub_id"]


def _hub_ids() -> dict[str, str]:
    return {_hub_id(name).lower(): name for name in snapshot_names()}


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


def unknown_model_note(model: str) -> str:
    """For a --model that is neither a folder nor a snapshot: the snapshots' names (and Hub ids), the close ones
    first."""
    names = snapshot_names()
    key = model.lower().rsplit("/", 1)[-1]
    close = [n for n in names if key and (key in n or n.startswith(key))] or \
        difflib.get_close_matches(key, names, n=2, cutoff=0.5)
    listed = ", ".join(f"{n} ({_hub_id(n)})" for n in names)
    guess = f"did you mean {' or '.join(close)}? " if close else ""
    return f"--model {model!r} is not a built-in model: {guess}meshdit plan knows {listed} offline"
