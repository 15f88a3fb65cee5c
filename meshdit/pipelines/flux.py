"""FLUX.1 (FluxPipeline). Guidance-distilled models embed the guidance scale; others
(guidance_embeds=False) use true classifier-free guidance with a negative prompt ("" by default)."""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

from .recipe import COND, UNCOND, DenoiseState, Recipe


class FluxRecipe(Recipe):
    packed_tokens = True
    default_steps = 28
    default_guidance = 3.5
    unbatched_keys = ("txt_ids", "img_ids")

    def prepare(self, request, generator, device):
        pipe = self.pipe
        height, width, steps, scale = self.settings(request)
        prompts, n = request.prompts, request.num_images_per_prompt
        max_len = request.extra.get("max_sequence_length", 512)
        distilled = pipe.transformer.config.guidance_embeds
        branches = {}
        embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=n, max_sequence_length=max_len)
        branches[COND] = dict(encoder_hidden_states=embeds, pooled_projections=pooled, txt_ids=text_ids)
        if not distilled and scale > 1:
            negative = [request.negative_prompt or ""] * len(prompts)
            n_embeds, n_pooled, n_ids = pipe.encode_prompt(
                prompt=negative, prompt_2=None, device=device, num_images_per_prompt=n, max_sequence_length=max_len)
            branches[UNCOND] = dict(encoder_hidden_states=n_embeds, pooled_projections=n_pooled, txt_ids=n_ids)
        latents, image_ids = pipe.prepare_latents(
            len(prompts) * n, pipe.transformer.config.in_channels // 4, height, width, embeds.dtype, device,
            generator)
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        cfg = pipe.scheduler.config
        mu = calculate_shift(latents.shape[1], cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        pipe.scheduler.set_begin_index(0)
        guidance = None
        if distilled:
            guidance = torch.full([1], scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        return DenoiseState(latents, timesteps, branches, scale, height, width,
                            extra=dict(img_ids=image_ids, guidance=guidance))

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                    guidance=state.extra["guidance"], img_ids=state.extra["img_ids"], joint_attention_kwargs={},
                    **state.branches[branch])

    def decode_latents(self, state, latents):
        pipe = self.pipe
        latents = pipe._unpack_latents(latents, state.height, state.width, pipe.vae_scale_factor)
        return latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
