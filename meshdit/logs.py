"""Quiet library logging on ranks unless --verbose: users read meshdit's lines, not every warning."""
from __future__ import annotations

import logging
import os
import warnings

# Read by transformers and diffusers when first imported: some warnings (e.g. transformers'
# "`CLIPImageProcessor` requires torchvision (not installed)") are logged at import time, before
# set_verbosity_error() can run. So quiet_libraries() must run before those imports.
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", message=".*torchvision.*")
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
