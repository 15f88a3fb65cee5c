"""Quiet library logging on ranks unless --verbose: users read meshdit's lines, not every warning."""
from __future__ import annotations

import logging
import warnings


def quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
