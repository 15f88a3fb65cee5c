"""SANA's tiny pipelines: diffusers' tests/pipelines/sana/test_sana.py config with 4 heads (Ulysses 4), a DC-AE
of factor 4 (three blocks: 4-pixel tokens, as the tests' sizes are written for) and a tiny Gemma2 with a
character-level tokenizer built in code."""
from __future__ import annotations

import string

import torch

from . import GUARD_PROMPT, GUARD_TEXT, GuardCase, TinyTests


def gemma_tokenizer():
    """A GemmaTokenizer over single characters (BPE without merges): every prompt encodes, no download."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    for piece in ["▁"] + list(string.ascii_letters + string.digits + ",.:'-()>"):
        vocab[piece] = len(vocab)
    return GemmaTokenizer(vocab=vocab)


def tiny_sana_pipeline(seed: int = 0, layers: int = 2):
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(seed)
    transformer = SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=layers, num_attention_heads=4, attention_head_dim=4,
        num_cross_attention_heads=4, cross_attention_head_dim=4, cross_attention_dim=16, caption_channels=8,
        sample_size=32,
    ).eval()
    vae = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8),
        encoder_qkv_multiscales=((), (), (5,)), decoder_qkv_multiscales=((), (), (5,)),
        encoder_layers_per_block=(1, 1, 1), decoder_layers_per_block=[1, 1, 1],
        downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
        decoder_act_fns="silu", scaling_factor=0.41407,
    ).eval()
    tokenizer = gemma_tokenizer()
    text_encoder = Gemma2Model(Gemma2Config(
        head_dim=16, hidden_size=8, initializer_range=0.02, intermediate_size=64, max_position_embeddings=8192,
        num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(tokenizer),
        attn_implementation="eager")).eval()
    return SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


BUILDERS = {
    "sana": tiny_sana_pipeline,
    "sana-4blocks": lambda seed=0: tiny_sana_pipeline(seed, layers=4),
}
TESTS = TinyTests(main="sana", four_blocks="sana-4blocks")
GUARD_CASES = {
    "sana": GuardCase("sana", dict(prompt=GUARD_PROMPT, guidance_scale=4.5, max_sequence_length=GUARD_TEXT,
                                   use_resolution_binning=False), 4.5,
                    size=dict(height=64, width=96)),  # SanaPipeline takes multiples of 32 px only
    # the pipeline's complex human instruction off (--extra complex_human_instruction=null)
    "sana-plain-prompt": GuardCase("sana", dict(prompt=GUARD_PROMPT, guidance_scale=4.5,
                                                max_sequence_length=GUARD_TEXT, use_resolution_binning=False,
                                                complex_human_instruction=None), 4.5,
                                   extra=dict(complex_human_instruction=None), size=dict(height=64, width=96)),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_sana.py: a 32 x 32 latent, 8 text tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, config.in_channels, 32, 32),
                encoder_hidden_states=d.randn(b, 8, config.caption_channels), timestep=d.steps())
