"""Overhead: meshdit with every degree 1 against the plain diffusers pipeline, same model, steps and seed.

Runs are interleaved A, B, A, B, ... so slow drift of the machine hits both
sides alike; the figure is the ratio of medians. The images must be the same.
The GPU variant (FLUX.1-dev shape, random bf16 weights, 1024x1024) runs only
where torch.cuda.is_available().
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine

from .models import ModelSize, flux_pipeline, pixels_for_tokens

PROMPT = "a red cat on a blue square"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(pipe, *, height: int, width: int, steps: int, text_tokens: int, pairs: int, seed: int = 0,
            warmup: int = 1) -> dict:
    """Engine(pipe).generate vs pipe(...): interleaved timings, ratio of medians, image difference."""
    device = pipe._execution_device
    engine = Engine(pipe)
    request = GenerateRequest(prompt=PROMPT, height=height, width=width, num_inference_steps=steps, seed=seed,
                              guidance_scale=1.0, extra={"max_sequence_length": text_tokens})

    def meshdit_run():
        return engine.generate(request, output_type="np").images

    def diffusers_run():
        # guidance_scale 1 and true_cfg_scale 1 (the default): one branch per step, like the request above
        return pipe(prompt=PROMPT, height=height, width=width, num_inference_steps=steps, guidance_scale=1.0,
                    max_sequence_length=text_tokens, generator=torch.Generator("cpu").manual_seed(seed),
                    output_type="np").images

    def timed(fn):
        _sync(device)
        start = time.perf_counter()
        images = fn()
        _sync(device)
        return time.perf_counter() - start, images

    for _ in range(warmup):
        meshdit_run(), diffusers_run()
    times = {"meshdit": [], "diffusers": []}
    images = {}
    for _ in range(pairs):  # A, B, A, B, ...
        for name, fn in (("meshdit", meshdit_run), ("diffusers", diffusers_run)):
            seconds, images[name] = timed(fn)
            times[name].append(seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "height": height, "width": width, "steps": steps, "text_tokens": text_tokens, "pairs": pairs,
        "seconds": times, "median_seconds": med, "ratio": med["meshdit"] / med["diffusers"],
        "max_abs_image_diff": float(np.abs(np.asarray(images["meshdit"], dtype=np.float64)
                                           - np.asarray(images["diffusers"], dtype=np.float64)).max()),
    }


def cpu_overhead(size: ModelSize, image_tokens: int, text_tokens: int, steps: int, pairs: int) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same single thread as each rank of the scaling runs
    try:
        pipe = flux_pipeline(size)
        px = pixels_for_tokens(image_tokens)
        result = compare(pipe, height=px, width=px, steps=steps, text_tokens=text_tokens, pairs=pairs)
    finally:
        torch.set_num_threads(threads)
    result.update(model=size.name, image_tokens=image_tokens, device="cpu (1 thread)")
    return result


# -- GPU: FLUX.1-dev shape ---------------------------------------------------------------------------------------

def flux_dev_pipeline(device: torch.device, dtype: torch.dtype = torch.bfloat16, tiny: bool = False):
    """FluxPipeline with FLUX.1-dev's transformer and VAE shapes, random weights.

    The text encoders are random one-layer stand-ins with the real output widths
    (T5: 4096 per token, CLIP pooled: 768): the benchmark times the same pipeline
    both ways, and the text encoders are not what meshdit changes. tiny=True
    shrinks everything (a CPU check of this code path).
    """
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from meshdit.testing.tiny_models import clip_tokenizer, t5_tokenizer

    t5_dim, clip_dim = (32, 16) if tiny else (4096, 768)
    transformer_kwargs = dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=t5_dim, pooled_projection_dim=clip_dim, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56))
    vae_kwargs = dict(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32,
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, sample_size=1024)
    if tiny:
        transformer_kwargs.update(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                                  axes_dims_rope=(4, 6, 6))
        vae_kwargs.update(block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4)
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)  # build in the target dtype: no fp32 copy of 12 B parameters
    try:
        with torch.device(device):
            transformer = FluxTransformer2DModel(**transformer_kwargs).eval()
            vae = AutoencoderKL(**vae_kwargs).eval()
            t5 = T5EncoderModel(T5Config(vocab_size=80, d_model=t5_dim, d_ff=256, d_kv=64, num_layers=1, num_heads=2,
                                         relative_attention_num_buckets=8)).eval()
            clip = CLIPTextModel(CLIPTextConfig(vocab_size=80, hidden_size=clip_dim, intermediate_size=256,
                                                num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                                bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()
    finally:
        torch.set_default_dtype(previous)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                        text_encoder=clip, tokenizer=clip_tokenizer(), text_encoder_2=t5, tokenizer_2=t5_tokenizer(),
                        transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def gpu_overhead(steps: int = 10, pairs: int = 3) -> dict:
    """FLUX.1-dev size at 1024x1024 on one GPU, bf16; skipped with a reason where there is none."""
    if not torch.cuda.is_available():
        return {"skipped": "torch.cuda.is_available() is False on this machine: no GPU overhead figure"}
    device = torch.device("cuda", 0)
    pipe = flux_dev_pipeline(device)
    result = compare(pipe, height=1024, width=1024, steps=steps, text_tokens=512, pairs=pairs)
    result.update(model="FLUX.1-dev shape (random weights), bf16", device=torch.cuda.get_device_name(device),
                  transformer_params=sum(p.numel() for p in pipe.transformer.parameters()))
    return result
