"""Chroma's tiny pipelines: diffusers' own test config (tests/pipelines/chroma/test_pipeline_chroma.py), with 4
heads (Ulysses 4) and meshdit's tiny VAE (factor 2, so tokens are 4 pixels wide as the image tests assume)."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests
from .parts import t5_text_model, t5_tokenizer, tiny_vae


def tiny_chroma_pipeline(seed: int = 0, double: int = 1, single: int = 1):
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(seed)
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=double, num_single_layers=single, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, axes_dims_rope=(4, 4, 8), approximator_hidden_dim=32,
        approximator_layers=1, approximator_num_channels=16,
    ).eval()
    return ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=tiny_vae(), text_encoder=t5_text_model(32),
                          tokenizer=t5_tokenizer(), transformer=transformer)


BUILDERS = {
    "chroma": tiny_chroma_pipeline,
    "chroma-4blocks": lambda seed=0: tiny_chroma_pipeline(seed, double=2, single=2),
}
# true CFG with a negative prompt; the prompt's padding (beyond its first pad token) masked in every attention
TESTS = TinyTests(main="chroma", four_blocks="chroma-4blocks", guidance=3.0)
GUARD_CASES = {
    "chroma": GuardCase("chroma", dict(prompt=GUARD_PROMPT, guidance_scale=1.0, max_sequence_length=GUARD_TEXT), 1.0),
    "chroma-true-cfg": GuardCase("chroma", dict(prompt=GUARD_PROMPT, negative_prompt="", guidance_scale=5.0,
                                                max_sequence_length=GUARD_TEXT), 5.0),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_chroma.py: 4 x 4 image tokens, 48 text tokens, 3-axis ids."""
    b = d.batch
    return dict(hidden_states=d.randn(b, 16, config.in_channels),
                encoder_hidden_states=d.randn(b, 48, config.joint_attention_dim), img_ids=d.randn(16, 3),
                txt_ids=d.randn(48, 3), timestep=d.ones())
