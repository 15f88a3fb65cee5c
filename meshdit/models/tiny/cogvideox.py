"""CogVideoX 1.0's tiny pipelines (5B-shaped rotary, 2B-shaped sin-cos table; DDIM or DPM)."""
from __future__ import annotations

import torch

from . import GUARD_PROMPT, GUARD_SIZE, GUARD_TEXT, GuardCase, TinyTests
from .parts import sample_image, t5_text_model, t5_tokenizer


def tiny_cogvideox_pipeline(seed: int = 0, layers: int = 2, rotary: bool = True, stochastic: bool = False,
                            text_length: int = 226, image_to_video: bool = False, learned: bool = False,
                            ofs: bool = False):
    """CogVideoX 1.0 text-to-video: rotary (5B-shaped) or, rotary False, the 2B's sin-cos positional table
    (which covers exactly max_text_seq_length = text_length text tokens: 226 as released, 16 in diffusers' tests).
    Tokens are 16 pixels wide (VAE 8 x patch 2) and 4 frames deep (+1 for the first frame). stochastic:
    CogVideoX-5B's DPM scheduler, which draws noise in every step; else the 2B's DDIM (eta 0: no noise).
    image_to_video: CogVideoXImageToVideoPipeline (in_channels doubled, as diffusers' test_cogvideox_image2video),
    with learned positional embeddings (CogVideoX-5B I2V: sized for the tests' 48 x 80 px, 9 frames, and
    text_length text tokens) or an ofs embedding (ofs_embed_dim as CogVideoX 1.5 I2V's, without its temporal
    patch)."""
    import diffusers
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXDPMScheduler, CogVideoXTransformer3DModel

    torch.manual_seed(seed)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=4, attention_head_dim=16, in_channels=8 if image_to_video else 4, out_channels=4,
        time_embed_dim=32, text_embed_dim=32, num_layers=layers, sample_width=10, sample_height=6, sample_frames=9,
        patch_size=2, temporal_compression_ratio=4, max_text_seq_length=text_length,
        use_rotary_positional_embeddings=rotary, use_learned_positional_embeddings=learned,
        ofs_embed_dim=32 if ofs else None).eval()
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=4,
        temporal_compression_ratio=4, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4).eval()
    with torch.no_grad():  # random weights put the decoder's raw output near +-20, which postprocessing clamps
        for p in vae.decoder.conv_out.parameters():  # to [0, 1]: scaled down, the video is mostly unclamped
            p.mul_(0.05)
    # CogVideoX-2B's schedule; the 5B's DPM differs in its SNR shift (1.0 for 3.0)
    schedule = dict(beta_end=0.012, beta_schedule="scaled_linear", beta_start=0.00085, clip_sample=False,
                    prediction_type="v_prediction", rescale_betas_zero_snr=True, set_alpha_to_one=True,
                    snr_shift_scale=1.0 if stochastic else 3.0, steps_offset=0, timestep_spacing="trailing")
    scheduler = (CogVideoXDPMScheduler if stochastic else CogVideoXDDIMScheduler)(**schedule)
    pipeline = "CogVideoXImageToVideoPipeline" if image_to_video else "CogVideoXPipeline"
    return getattr(diffusers, pipeline)(tokenizer=t5_tokenizer(), text_encoder=t5_text_model(32), vae=vae,
                                        transformer=transformer, scheduler=scheduler)


def tiny_cogvideox_i2v_pipeline(seed: int = 0, layers: int = 2, ofs: bool = False):
    """CogVideoX image-to-video: 5B-I2V-shaped (rotary and learned positional embeddings over 16 text tokens, as
    diffusers' test config), or with ofs: an ofs embedding, rotary only, any text length."""
    return tiny_cogvideox_pipeline(seed, layers, text_length=226 if ofs else 16, image_to_video=True,
                                   learned=not ofs, ofs=ofs)


BUILDERS = {
    "cogvideox": tiny_cogvideox_pipeline,
    "cogvideox-sincos": lambda seed=0: tiny_cogvideox_pipeline(seed, rotary=False),
    "cogvideox-dpm": lambda seed=0: tiny_cogvideox_pipeline(seed, stochastic=True),
    # the sin-cos table of diffusers' test config: 16 text tokens (the fixed length read from the config)
    "cogvideox-sincos16": lambda seed=0: tiny_cogvideox_pipeline(seed, rotary=False, text_length=16),
    "cogvideox-sincos16-4blocks": lambda seed=0: tiny_cogvideox_pipeline(seed, layers=4, rotary=False, text_length=16),
    "cogvideox-4blocks": lambda seed=0: tiny_cogvideox_pipeline(seed, layers=4),
    "cogvideox-dpm-4blocks": lambda seed=0: tiny_cogvideox_pipeline(seed, layers=4, stochastic=True),
    "cogvideox-i2v": tiny_cogvideox_i2v_pipeline,
    "cogvideox-i2v-4blocks": lambda seed=0: tiny_cogvideox_i2v_pipeline(seed, layers=4),
    "cogvideox-i2v-ofs": lambda seed=0: tiny_cogvideox_i2v_pipeline(seed, ofs=True),
}
TESTS = TinyTests(main="cogvideox", four_blocks="cogvideox-4blocks",
                  image_to_video=(("cogvideox-i2v", "cogvideox-i2v-4blocks"),),
                  tensor_parallel=("cogvideox", "cogvideox-i2v"))
_VIDEO = dict(prompt=GUARD_PROMPT, guidance_scale=6.0, num_frames=5)
_GUARD_HW = dict(height=GUARD_SIZE["height"], width=GUARD_SIZE["width"])
GUARD_CASES = {
    "cogvideox": GuardCase("cogvideox", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 6.0),
    # 2B-shaped: the sin-cos table covers exactly its max_text_seq_length text tokens
    "cogvideox-sincos": GuardCase("cogvideox-sincos", _VIDEO, 6.0),
    # 3 steps: DPM's second-order update (its previous x0 prediction) runs from the second step on
    "cogvideox-dpm": GuardCase("cogvideox-dpm", dict(_VIDEO, max_sequence_length=GUARD_TEXT), 6.0,
                               size=dict(GUARD_SIZE, num_inference_steps=3)),
    # image-to-video, 5B-I2V-shaped: learned positional embeddings sized for 48 x 80 px and 9 frames, 16 text tokens
    "cogvideox-i2v": GuardCase("cogvideox-i2v", dict(_VIDEO, image=sample_image(48, 80), num_frames=9,
                                                     max_sequence_length=GUARD_TEXT), 6.0,
                               size=dict(GUARD_SIZE, height=48, width=80)),
    # the ofs embedding (the pipeline's constant 2.0, one row for both CFG branches)
    "cogvideox-i2v-ofs": GuardCase("cogvideox-i2v-ofs", dict(_VIDEO, image=sample_image(**_GUARD_HW),
                                                             max_sequence_length=GUARD_TEXT), 6.0),
}


def diffusers_test_inputs(config, d) -> dict:
    """diffusers' test_models_transformer_cogvideox.py: 1 frame of 8 x 8, 8 text tokens."""
    b = d.batch
    return dict(hidden_states=d.randn(b, 1, config.in_channels, 8, 8),
                encoder_hidden_states=d.randn(b, 8, config.text_embed_dim), timestep=d.steps())
