"""LTX-Video's tiny pipelines."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT, GuardCase, TinyTests
from .parts import sample_image, t5_text_model, t5_tokenizer


def tiny_ltx_pipeline(seed: int = 0, layers: int = 2, pipeline: str = "LTXPipeline"):
    """LTX-Video text-to-video (or `pipeline`: LTXImageToVideoPipeline, on the same components, as diffusers'
    test_ltx_image2video). Its VAE packs 8 x 8 pixels and upsamples space and time twice: tokens 32 pixels
    wide (LTXPipeline asks for multiples of 32) and 4 frames deep (+1 for the first frame); its decoder is
    timestep-conditioned (LTX 0.9.1+), so decoding draws the pipeline's decode noise and takes `temb`."""
    import diffusers
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=layers, caption_channels=32).eval()
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False), decoder_spatio_temporal_scaling=(True, True, False, False),
        timestep_conditioning=True, patch_size=8, patch_size_t=1).eval()
    # LTXConditionPipeline passes its own timesteps, without the shift `mu` a dynamically shifting scheduler needs
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=pipeline != _CONDITION)
    return getattr(diffusers, pipeline)(scheduler=scheduler, vae=vae, text_encoder=t5_text_model(32),
                                        tokenizer=t5_tokenizer(), transformer=transformer)


_I2V, _CONDITION = "LTXImageToVideoPipeline", "LTXConditionPipeline"
BUILDERS = {
    "ltx": tiny_ltx_pipeline,
    "ltx-4blocks": lambda seed=0: tiny_ltx_pipeline(seed, layers=4),
    "ltx-i2v": lambda seed=0: tiny_ltx_pipeline(seed, pipeline=_I2V),
    "ltx-i2v-4blocks": lambda seed=0: tiny_ltx_pipeline(seed, layers=4, pipeline=_I2V),
    "ltx-condition": lambda seed=0: tiny_ltx_pipeline(seed, pipeline=_CONDITION),
    "ltx-condition-4blocks": lambda seed=0: tiny_ltx_pipeline(seed, layers=4, pipeline=_CONDITION),
}
# tokens 32 px wide; LTX 0.9.1's decode: a nonzero `temb` and the decode noise (cut with the batch); image-to-video:
# the per-token timestep split with the tokens
TESTS = TinyTests(main="ltx", four_blocks="ltx-4blocks", token_scale=2,
                  request_extra={"decode_timestep": 0.05, "decode_noise_scale": 0.025},
                  image_to_video=(("ltx-i2v", "ltx-i2v-4blocks"), ("ltx-condition", "ltx-condition-4blocks")))
# _cp_plan entries meshdit leaves whole (tests/models/test_diffusers_guard.py): text stays whole on every rank, since LTX's
# attn2 is cross-attention (LOCAL): each rank's image tokens attend to all of it without communication (diffusers
# shards it and lets its ring gather K/V)
CP_PLAN_NOT_SPLIT = {("", "encoder_hidden_states"): "text whole: cross-attention is local",
                     ("", "encoder_attention_mask"): "text whole: cross-attention is local"}
# splits of meshdit's plan that diffusers' _cp_plan lacks: image-to-video's per-token timestep [B, S] (diffusers
# leaves it whole, so its context parallelism cannot run LTXImageToVideoPipeline)
PLAN_NOT_IN_CP_PLAN = {("", "timestep"): "image-to-video's per-token timestep, split with the tokens"}
# LTXPipeline asks for multiples of 32 pixels; its frame_rate is meshdit's fps (it scales the rotary positions)
_VIDEO = dict(prompt=GUARD_PROMPT, guidance_scale=3.0, num_frames=9, max_sequence_length=GUARD_TEXT)
_SIZE = dict(GUARD_SIZE, height=64, width=96)
GUARD_CASES = {
    "ltx": GuardCase("ltx", _VIDEO, 3.0, size=_SIZE),
    "ltx-8fps": GuardCase("ltx", dict(_VIDEO, frame_rate=8), 3.0, size=_SIZE),
    # LTX 0.9.1's recommended decode: timestep 0.05, latents mixed with 2.5 % noise
    "ltx-decode-timestep": GuardCase("ltx", dict(_VIDEO, decode_timestep=0.05, decode_noise_scale=0.025), 3.0,
                                     {"decode_timestep": 0.05, "decode_noise_scale": 0.025}, _SIZE),
    # the image's latents on the first latent frame (timestep 0 there), with the decode noise after them
    "ltx-i2v": GuardCase("ltx-i2v", dict(_VIDEO, image=sample_image(_SIZE["height"], _SIZE["width"]),
                                         decode_timestep=0.05, decode_noise_scale=0.025), 3.0,
                         {"decode_timestep": 0.05, "decode_noise_scale": 0.025}, _SIZE),
    # --image as the condition at frame 0 (strength 1), re-noised each step; per-token timesteps in the step
    "ltx-condition": GuardCase("ltx-condition", dict(_VIDEO, image=sample_image(_SIZE["height"], _SIZE["width"]),
                                                     decode_timestep=0.05, decode_noise_scale=0.025), 3.0,
                               {"decode_timestep": 0.05, "decode_noise_scale": 0.025}, _SIZE),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_ltx.py: packed tokens of 2 frames x 16 x 16, 16 text tokens, a [B]
    timestep (no tokens: the plan's timestep split leaves it whole)."""
    b = d.batch
    return dict(hidden_states=d.randn(b, 2 * 16 * 16, config.in_channels),
                encoder_hidden_states=d.randn(b, 16, config.caption_channels), timestep=d.steps(),
                encoder_attention_mask=torch.ones(b, 16).bool(), num_frames=2, height=16, width=16)
