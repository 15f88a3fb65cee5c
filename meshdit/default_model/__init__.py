"""meshdit's default model: a tiny text-to-image DiT (diffusers FluxPipeline format)
trained by the project on procedural captioned shapes. See weights/README.md.

Only what `meshdit generate` needs lives here (the weights and the settings they were trained for);
the trainer, dataset and evaluator are the repository's top-level `default_model/` package.

    from diffusers import FluxPipeline
    from meshdit.default_model import weights_path, generation_kwargs
    pipe = FluxPipeline.from_pretrained(weights_path())
    image = pipe("two red circles on a white background", **generation_kwargs()).images[0]
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_HEIGHT = 256
DEFAULT_WIDTH = 256
DEFAULT_STEPS = 20
DEFAULT_GUIDANCE = 3.0  # FluxPipeline true_cfg_scale (real classifier-free guidance)
DEFAULT_NEGATIVE_PROMPT = ""  # the model was trained with 10% empty captions
DEFAULT_MAX_SEQUENCE_LENGTH = 32  # T5 tokens the model was trained with (FluxPipeline's default is 512)
DEFAULT_PROMPT = "two red circles on a white background"


def weights_path() -> Path:
    """Folder holding the trained FluxPipeline (FluxPipeline.from_pretrained(weights_path()))."""
    return Path(__file__).resolve().parent / "weights"


def generation_kwargs() -> dict:
    """Keyword arguments for FluxPipeline.__call__ that this model was trained for."""
    return dict(
        height=DEFAULT_HEIGHT,
        width=DEFAULT_WIDTH,
        num_inference_steps=DEFAULT_STEPS,
        true_cfg_scale=DEFAULT_GUIDANCE,
        negative_prompt=DEFAULT_NEGATIVE_PROMPT,
        max_sequence_length=DEFAULT_MAX_SEQUENCE_LENGTH,
    )
