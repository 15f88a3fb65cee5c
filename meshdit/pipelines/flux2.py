"""FLUX.2 (Flux2Pipeline): guidance-distilled, no negative branch."""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, retrieve_timesteps

from .recipe import COND, DenoiseState, Recipe


class Flux2Recipe(Recipe):
    packed_tokens = True
    default_steps = 50
    default_guidance = 4.0

    def prepare(self, request, generator, device):
        pipe = self.pipe
        height, width, steps, scale = self.settings(request)
        given = request.extra.get("prompt_embeds")  # [B, S, D], for models loaded without a text encoder
        embeds, text_ids = pipe.encode_prompt(
            prompt=None if given is not None else request.prompts, prompt_embeds=given, device=device,
            num_images_per_prompt=request.num_images_per_prompt,
            max_sequence_length=request.extra.get("max_sequence_length", 512))
        latents, latent_ids = pipe.prepare_latents(
            batch_size=embeds.shape[0], num_latents_channels=pipe.transformer.config.in_channels // 4,
            height=height, width=width, dtype=embeds.dtype, device=device, generator=generator)
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=steps)
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)
        pipe.scheduler.set_begin_index(0)
        guidance = torch.full([1], scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        branches = {COND: dict(encoder_hidden_states=embeds, txt_ids=text_ids)}
        return DenoiseState(latents, timesteps, branches, scale, height, width,
                            extra=dict(img_ids=latent_ids, guidance=guidance))

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents.to(self.pipe.transformer.dtype),
                    timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000, guidance=state.extra["guidance"],
                    img_ids=state.extra["img_ids"], joint_attention_kwargs=None, **state.branches[branch])

    def decode_latents(self, state, latents):
        pipe = self.pipe
        latents = pipe._unpack_latents_with_ids(latents, state.extra["img_ids"])
        bn = pipe.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps).to(
            latents.device, latents.dtype)
        return pipe._unpatchify_latents(latents * std + mean)
