"""The Python API takes what a newcomer passes first (issue 60, item 5): a prompt string to Engine.generate, and
refuses SANA's parallel VAE with the CLI's documented reason, before any decode."""
import numpy as np
import pytest

from meshdit.cli import build_parser, generate_settings
from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.testing.tiny_models import tiny_pipeline
from meshdit.vae import VaeDecodeSettings


def test_generate_takes_a_prompt_string_as_a_request_of_defaults():
    engine = Engine(tiny_pipeline("sd3"))
    try:
        by_text = engine.generate("a red circle").images
        by_request = engine.generate(GenerateRequest(prompt="a red circle")).images
        assert np.array_equal(by_text, by_request)
        with pytest.raises(ConfigError, match="takes a GenerateRequest or a prompt \\(str\\), got dict"):
            engine.generate({"prompt": "a red circle"})
    finally:
        engine.close()


def test_sana_parallel_vae_is_refused_with_the_clis_reason():
    with pytest.raises(ConfigError, match="cannot decode this model's AutoencoderDC exactly: SANA's DC-AE"):
        Engine(tiny_pipeline("sana"), vae=VaeDecodeSettings(parallel=True))


def test_generate_takes_size_as_width_x_height():
    args = build_parser().parse_args(["generate", "--size", "128x64"])
    request = generate_settings(args)[2]
    assert (request.width, request.height) == (128, 64)
