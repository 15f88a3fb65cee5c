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


def tiny_wan_vae(base_dim: int = 12):
    """AutoencoderKLWan as diffusers' Wan tests build it (spatial factor 8, temporal factor 4), but 12 base channels
    instead of 3: each upsampler halves its channels, 3 // 2 = 1, and an RMS norm over one channel is x / |x| =
    sign(x), a step; near-zero pixels flipped sign on the parallel layouts' 1e-7 rounding, which at 81 frames (more
    pixels, more near zero) put 0.07-0.24 into the video (docs/exactness.md). Over 8 (norms over 4 and 8): 0.4-0.9
    of the tests' 1e-5 bound there, and tp 2 on the image-to-video build 1.1 of it; over 12, about 0.2. base_dim: benchmarks that time the transformer keep 3 (a smaller decode)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=base_dim, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def tiny_wan22_vae():
    """Wan 2.2 TI2V-5B's VAE as diffusers' Wan 2.2 5B test builds it (48 latent channels, patch size 2 and residual
    blocks, spatial factor 16, temporal factor 4), but 8 base channels instead of 3: over 3 channels its RMS norms
    made the decoder amplify a relative latent change 3 to 84 times (4 seeds), so the parallel layouts' rounding
    (1e-7) came out above the tests' 1e-5 bound in the video; over 8, about 2 times."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
                            latents_mean=[0.0] * 48, latents_std=[1.0] * 48, dim_mult=[1, 1, 1, 1],
                            num_res_blocks=1, scale_factor_spatial=16, scale_factor_temporal=4,
                            temperal_downsample=[False, True, True]).eval()


def tiny_wan_transformer(layers: int = 2, image_to_video: bool = False, channels: int = 16):
    """image_to_video: 16 noise + 4 mask + 16 image-latent input channels, and (Wan 2.1 I2V) K/V projections
    of CLIP image embeddings in every cross-attention; channels: the latents' (TI2V: 48)."""
    from diffusers import WanTransformer3DModel

    image = dict(in_channels=36, image_dim=8, added_kv_proj_dim=48) if image_to_video else dict(in_channels=channels)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, out_channels=channels, text_dim=32,
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


def tiny_wan22_ti2v_pipeline(seed: int = 0, layers: int = 2, image_to_video: bool = False):
    """Wan 2.2 TI2V-5B (diffusers' Wan 2.2 5B test config, 4 heads): expand_timesteps, a timestep per token; its
    VAE's 16 pixels x patch 2 make tokens 32 pixels wide. image_to_video: WanImageToVideoPipeline without an image
    encoder, the image's latents as the first latent frame (at timestep 0)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanPipeline

    torch.manual_seed(seed)
    parts = dict(tokenizer=t5_tokenizer(), text_encoder=umt5_text_model(32), vae=tiny_wan22_vae(),
                 scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                 transformer=tiny_wan_transformer(layers, channels=48), expand_timesteps=True)
    if image_to_video:
        return WanImageToVideoPipeline(image_processor=None, image_encoder=None, **parts)
    return WanPipeline(**parts)


BUILDERS = {
    "wan": tiny_wan_pipeline,
    "wan22": lambda seed=0: tiny_wan_pipeline(seed, two_experts=True),
    "wan-i2v": tiny_wan_i2v_pipeline,
    "wan-4blocks": lambda seed=0: tiny_wan_pipeline(seed, layers=4),
    "wan-i2v-4blocks": lambda seed=0: tiny_wan_i2v_pipeline(seed, layers=4),
    # Wan 2.2 TI2V-5B: tests/models/test_wan22_ti2v.py runs them (tokens twice as wide as the other builds')
    "wan22-ti2v": tiny_wan22_ti2v_pipeline,
    "wan22-ti2v-4blocks": lambda seed=0: tiny_wan22_ti2v_pipeline(seed, layers=4),
    "wan22-ti2v-i2v": lambda seed=0: tiny_wan22_ti2v_pipeline(seed, image_to_video=True),
    "wan22-ti2v-i2v-4blocks": lambda seed=0: tiny_wan22_ti2v_pipeline(seed, layers=4, image_to_video=True),
}
_TI2V = ("wan22-ti2v", "wan22-ti2v-4blocks", "wan22-ti2v-i2v", "wan22-ti2v-i2v-4blocks")
TESTS = TinyTests(main="wan", four_blocks="wan-4blocks", build_scales={name: 2 for name in _TI2V},
                  tensor_parallel=("wan", "wan-i2v", "wan22-ti2v", "wan22-ti2v-i2v"))
_VIDEO = dict(prompt=GUARD_PROMPT, guidance_scale=5.0, num_frames=5)  # 5 frames: 2 latent frames
_TI2V_SIZE = dict(height=64, width=96)  # 32-pixel tokens: 2 x 3 per frame
GUARD_CASES = {
    "wan": GuardCase("wan", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 5.0),
    "wan22-two-experts": GuardCase("wan22", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 5.0),
    # image-to-video: its text length is fixed at 512 (no max_sequence_length); the image goes in as PIL
    "wan-i2v": GuardCase("wan-i2v", dict(_VIDEO, image=sample_image(GUARD_SIZE["height"], GUARD_SIZE["width"])),
                         5.0),
    # Wan 2.2 TI2V-5B: a timestep per token; image-to-video with the image's latents as the first frame (t = 0)
    "wan22-ti2v": GuardCase("wan22-ti2v", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 5.0, size=_TI2V_SIZE),
    "wan22-ti2v-i2v": GuardCase("wan22-ti2v-i2v", dict(_VIDEO, max_sequence_length=GUARD_TEXT, image=sample_image(
        _TI2V_SIZE["height"], _TI2V_SIZE["width"])), 5.0, size=_TI2V_SIZE),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_wan.py: 2 frames of 16 x 16, 12 text tokens, a [B] timestep."""
    b = d.batch
    return dict(hidden_states=d.randn(b, config.in_channels, 2, 16, 16),
                encoder_hidden_states=d.randn(b, 12, config.text_dim), timestep=d.steps())
