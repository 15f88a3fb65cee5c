"""LTX-Video (LTXPipeline / LTXVideoTransformer3DModel): text-to-video, self-attention over packed video tokens
with 3-D rotary embeddings from the token coordinates, cross-attention to T5 text (with its padding mask).

The pipeline packs the latents itself into [B, S, C] tokens, frame-major (F' x H' x W', as Flux packs an
image's), so the model takes the token sequence as its input and the grid's size as plain ints. Its rotary
positions are scaled by the frame rate (rope_interpolation_scale), so the request's fps conditions the video.
A timestep-conditioned VAE (LTX 0.9.1+) decodes at a timestep, from latents mixed with fresh noise: the
pipeline's decode_timestep and decode_noise_scale, request extras here (Python API: extra={"decode_timestep":
0.05, "decode_noise_scale": 0.025}, LTX 0.9.1's recommended values; default 0 and None, the pipeline's).

Image-to-video (LTXImageToVideoPipeline): the image's VAE latents replace the first latent frame, and its
conditioning mask [B, S] (1 on those tokens) makes their timestep 0: the model takes a per-token timestep
[B, S], which sequence parallelism and PipeFusion's patches cut with the video tokens (the plan's `timestep`
split); text-to-video passes [B, 1], a table every rank keeps whole. The pipeline steps only the other frames;
here the guided velocity is 0 on the mask, so flow-match Euler's x + dt * v leaves those tokens exactly as they
are, patch by patch too.
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps
from diffusers.utils import load_image
from diffusers.utils.torch_utils import randn_tensor

from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe
from ..parallel.plan import LOCAL, OUTPUT, BlockList, Gather, ModelPlan, SequencePlan, StagePlan, Split

# The tokens are sharded where the model takes them, the rotary table (cos, sin), each [B, S, D], where the
# rope module returns it (the rope builds the whole grid from the ints, so it needs no split input), as
# diffusers' _cp_plan does. Text stays whole on every rank (attn2 is cross-attention: LOCAL), so its tokens
# and padding mask are not split, unlike the _cp_plan's (tests/models/test_diffusers_guard.py: NOT_SPLIT).
# The timestep is per token [B, S] in image-to-video, split with the tokens; [B, 1] in text-to-video (a table).
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("", "hidden_states", -2, "img"),
            Split("", "timestep", -1, "img", table=True),
            Split("rope", OUTPUT, -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "transformer_blocks.*.attn1": ("img",),
            "transformer_blocks.*.attn2": LOCAL,
        },
    ),
    StagePlan(blocks=(BlockList("transformer_blocks", ("hidden_states",), "hidden_states"),)),
)


class LTXRecipe(VideoRecipe):
    batch_branches = True  # uncond and cond in one call, as the pipeline batches them

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        embeds, mask, n_embeds, n_mask = pipe.encode_prompt(  # [B, L, D], [B, L] each
            prompt=r.prompts, negative_prompt=r.negative_prompt, do_classifier_free_guidance=cfg,
            num_videos_per_prompt=r.num_images_per_prompt, max_sequence_length=r.extra["max_sequence_length"],
            device=device)
        branches = {COND: dict(encoder_hidden_states=embeds, encoder_attention_mask=mask)}
        if cfg:  # uncond first: the order the pipeline batches them in
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, encoder_attention_mask=n_mask), **branches}
        batch = embeds.shape[0]
        latents, condition = self.prepare_latents(r, batch, embeds.dtype, device, generator)
        temporal, spatial = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
        grid = dict(num_frames=(r.num_frames - 1) // temporal + 1, height=r.height // spatial,
                    width=r.width // spatial)  # latent frames, rows, columns
        cfg_s = pipe.scheduler.config
        mu = calculate_shift(grid["num_frames"] * grid["height"] * grid["width"], cfg_s.get("base_image_seq_len", 256),
                             cfg_s.get("max_image_seq_len", 4096), cfg_s.get("base_shift", 0.5),
                             cfg_s.get("max_shift", 1.15))
        steps = r.num_inference_steps
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 1 / steps, steps),
                                          mu=mu)
        pipe.scheduler.set_begin_index(0)
        decode = None
        if pipe.vae.config.timestep_conditioning:
            # the pipeline draws the decode noise from the same generator right after the denoising loop, which
            # draws nothing (flow-match Euler): drawn here, it is the same noise, and every rank holds it
            shape = (batch, pipe.vae.config.latent_channels, grid["num_frames"], grid["height"], grid["width"])
            timestep = float(r.extra.get("decode_timestep", 0.0))
            scale = r.extra.get("decode_noise_scale")  # None: the timestep, as in the pipeline
            decode = dict(noise=randn_tensor(shape, generator=generator, device=device, dtype=embeds.dtype),
                          timestep=torch.full((batch,), timestep, device=device, dtype=embeds.dtype),  # [B]
                          scale=torch.full((batch,), timestep if scale is None else float(scale), device=device,
                                           dtype=embeds.dtype))  # [B]
        grid["rope_interpolation_scale"] = (temporal / r.fps, spatial, spatial)  # the pipeline's frame_rate = fps
        patch_t = pipe.transformer_temporal_patch_size
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(grid=grid, token_frames=grid["num_frames"] // patch_t, decode=decode,
                                       dtype=embeds.dtype, condition=condition))

    def prepare_latents(self, r, batch, dtype, device, generator):
        """([B, S, C] packed noise tokens, fp32 as the pipeline keeps them; no conditioning mask)."""
        pipe = self.pipe
        return pipe.prepare_latents(batch, pipe.transformer.config.in_channels, r.height, r.width, r.num_frames,
                                    torch.float32, device, generator), None

    def model_inputs(self, state, latents, t, branch):
        timestep = t.expand(latents.shape[0])[:, None]  # [B, 1]: the model flattens it, as the pipeline's [B]
        condition = state.extra["condition"]
        if condition is not None:  # [B, S]: 0 on the conditioning tokens
            timestep = timestep * (1 - condition)
        return dict(hidden_states=latents.to(state.extra["dtype"]), timestep=timestep,
                    attention_kwargs=None, **state.extra["grid"], **state.branches[branch])

    def guide(self, state, preds):
        pred = super().guide(state, preds)
        condition = state.extra["condition"]
        if condition is None:
            return pred
        # the pipeline steps the frames after the conditioning ones only: a velocity of 0 keeps them exactly
        return torch.where(condition[..., None].bool(), torch.zeros_like(pred), pred)

    def postprocess_prediction(self, state, pred):
        return pred.float()

    def decode_latents(self, state, latents):
        pipe = self.pipe
        grid = state.extra["grid"]
        # Private static methods: LTXPipeline has no public one that unpacks [B, S, C] tokens into
        # [B, C, F, h, w] or undoes the VAE's latent normalization.
        latents = pipe._unpack_latents(latents, grid["num_frames"], grid["height"], grid["width"],
                                       pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size)
        latents = pipe._denormalize_latents(latents, pipe.vae.latents_mean, pipe.vae.latents_std,
                                            pipe.vae.config.scaling_factor).to(state.extra["dtype"])
        decode = state.extra["decode"]
        if decode is not None:  # the pipeline's mix of latents and noise
            scale = decode["scale"][:, None, None, None, None]
            latents = (1 - scale) * latents + scale * decode["noise"]
        return latents.to(pipe.vae.dtype)

    def vae_decode_kwargs(self, state):
        decode = state.extra["decode"]
        return {} if decode is None else dict(temb=decode["timestep"])


class LTXImageToVideoRecipe(LTXRecipe):
    """LTXImageToVideoPipeline: --image's latents in place of the first latent frame."""

    def prepare_latents(self, r, batch, dtype, device, generator):
        """([B, S, C] tokens: the image's normalized latents on the first frame, noise after; [B, S] mask)."""
        pipe = self.pipe
        image = pipe.video_processor.preprocess(load_image(r.image), height=r.height, width=r.width).to(
            device=device, dtype=dtype)  # [1, 3, H, W]
        return pipe.prepare_latents(image, batch, pipe.transformer.config.in_channels, r.height, r.width,
                                    r.num_frames, torch.float32, device, generator)


RECIPE = LTXRecipe
RECIPES = {"LTXImageToVideoPipeline": LTXImageToVideoRecipe}
