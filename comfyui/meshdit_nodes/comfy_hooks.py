"""ComfyUI's progress bar, interrupt flag and output folder, imported when a node runs (not when the pack
loads), so the pack imports without ComfyUI (tests, linters) and inside ComfyUI uses ComfyUI's own calls:
`comfy.utils.ProgressBar`, `comfy.model_management.processing_interrupted` /
`throw_exception_if_processing_interrupted`, `folder_paths.get_output_directory`."""
from __future__ import annotations

import os
import tempfile


class Interrupted(Exception):
    """Raised outside ComfyUI where ComfyUI raises its InterruptProcessingException."""


class _NoBar:
    def __init__(self, total) -> None:
        self.total = total

    def update_absolute(self, value, total=None, preview=None) -> None:
        pass


def progress_bar(total: int):
    """ComfyUI's progress bar of the running node (update_absolute(value, total)), or one that does nothing."""
    try:
        from comfy.utils import ProgressBar
    except ImportError:
        return _NoBar(total)
    return ProgressBar(total)


def interrupted() -> bool:
    """True once the user interrupted the queue (ComfyUI's Cancel / the queue's X)."""
    try:
        from comfy.model_management import processing_interrupted
    except ImportError:
        return False
    return bool(processing_interrupted())


def raise_interrupt() -> None:
    """Ends the node the way ComfyUI's own nodes do after an interrupt: its exception, which also clears the
    flag, so ComfyUI reports the prompt as interrupted rather than failed."""
    try:
        from comfy.model_management import throw_exception_if_processing_interrupted
    except ImportError:
        raise Interrupted("interrupted") from None
    throw_exception_if_processing_interrupted()
    raise Interrupted("interrupted")  # the flag was cleared by someone else meanwhile


def output_directory() -> str:
    """ComfyUI's output folder (where SaveImage writes), or the temporary folder outside ComfyUI."""
    try:
        import folder_paths
    except ImportError:
        return os.environ.get("MESHDIT_COMFY_OUTPUT", tempfile.gettempdir())
    return folder_paths.get_output_directory()
