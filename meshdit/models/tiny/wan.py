"""Wan 2.1 / 2.2's tiny pipelines (text-to-video, two experts, image-to-video)."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT, GuardCase, TinyTests
from .parts import sample_image, t5_tokenizer


def umt5_text_model(d_model: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=80, d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8)
    return UMT5EncoderModel(cfg).eval()


def tiny_wan_vae():
    """AutoencoderKLWan as diffusers' Wan tests build it: spatial factor 8, temporal factor 4."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def tiny_wan_transformer(layers: int = 2, image_to_video: bool = False):
    """image_to_video: 16 noise + 4 mask + 16 image-latent input channels, and (Wan 2.1 I2V) K/V projections
    of CLIP image embeddings in every cross-attention."""
    from diffusers import WanTransformer3DModel

    image = dict(in_channels=36, image_dim=8, added_kv_proj_dim=48) if image_to_video else dict(in_channels=16)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, out_channels=16, text_dim=32,
        freq_dim=32, ffn_dim=32, num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, **image,
    ).eval()


def tiny_wan_pipeline(seed: int = 0, layers: int = 2, two_experts: bool = False):
    """Wan 2.1 text-to-video, or (two_experts) Wan 2.2's pair: transformer for t >= 0.9 x 1000, transformer_2
    below (2 steps: t = 1000, then 47: one step each). Tokens are 16 pixels wide (VAE 8 x patch 2) and 4
    frames deep (+1 for the first frame)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(layers)
    transformer_2 = tiny_wan_transformer(layers) if two_experts else None
    return WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(32), vae=tiny_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), transformer=transformer,
                       transformer_2=transformer_2, boundary_ratio=0.9 if two_experts else None)


def tiny_wan_i2v_pipeline(seed: int = 0, layers: int = 2):
    """Wan 2.1 image-to-video: a tiny CLIP vision encoder (32 px crops) gives the image embeddings. Its
    cross-attention takes the text at exactly 512 tokens (diffusers' WanAttnProcessor cuts there)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(layers, image_to_video=True)
    encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=8, projection_dim=8, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, intermediate_size=16,
                                               patch_size=8)).eval()
    return WanImageToVideoPipeline(
        tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(32), vae=tiny_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), image_processor=CLIPImageProcessor(crop_size=32, size=32),
        image_encoder=encoder, transformer=transformer)


BUILDERS = {
    "wan": tiny_wan_pipeline,
    "wan22": lambda seed=0: tiny_wan_pipeline(seed, two_experts=True),
    "wan-i2v": tiny_wan_i2v_pipeline,
    "wan-4blocks": lambda seed=0: tiny_wan_pipeline(seed, layers=4),
    "wan-i2v-4blocks": lambda seed=0: tiny_wan_i2v_pipeline(seed, layers=4),
}
TESTS = TinyTests(main="wan", four_blocks="wan-4blocks")
# _cp_plan entries meshdit leaves whole (tests/models/test_diffusers_guard.py): split only when the timestep is [B, S]
# (one per token: Wan 2.2 TI2V's expand_timesteps, which meshdit refuses before ranks start); every other Wan
# model passes [B], which has no tokens to split
CP_PLAN_NOT_SPLIT = {("", "timestep"): "per-token timesteps only"}
_VIDEO = dict(prompt=GUARD_PROMPT, guidance_scale=5.0, num_frames=5)  # 5 frames: 2 latent frames
GUARD_CASES = {
    "wan": GuardCase("wan", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 5.0),
    "wan22-two-experts": GuardCase("wan22", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 5.0),
    # image-to-video: its text length is fixed at 512 (no max_sequence_length); the image goes in as PIL
    "wan-i2v": GuardCase("wan-i2v", dict(_VIDEO, image=sample_image(GUARD_SIZE["height"], GUARD_SIZE["width"])),
                         5.0),
}
