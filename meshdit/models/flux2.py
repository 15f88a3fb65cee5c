"""FLUX.2 (Flux2Pipeline / Flux2Transformer2DModel): like FLUX.1 with batched [B, S, 4] position ids;
guidance-distilled, no negative branch."""
from __future__ import annotations

import torch
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, retrieve_timesteps

from ..parallel.plan import BlockList, ModelPlan, StagePlan
from ..denoising.recipe import COND, DenoiseState, Recipe, flow_sigmas
from .flux import SEQUENCE_PLAN  # the same streams; dims count from the end, so batched ids split alike

# Between the lists the model concatenates [txt, img] into one stream for the single blocks.
PLAN = ModelPlan(SEQUENCE_PLAN, StagePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    BlockList("single_transformer_blocks", ("hidden_states",), "hidden_states"),
)))


class Flux2Recipe(Recipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        given = r.extra.get("prompt_embeds")  # [B, S, D], for models loaded without a text encoder
        embeds, text_ids = pipe.encode_prompt(
            prompt=None if given is not None else r.prompts, prompt_embeds=given, device=device,
            num_images_per_prompt=r.num_images_per_prompt, max_sequence_length=r.extra["max_sequence_length"])
        latents, latent_ids = pipe.prepare_latents(  # [B, S, 4C] packed, [B, S, 4]
            batch_size=embeds.shape[0], num_latents_channels=pipe.transformer.config.in_channels // 4,
            height=r.height, width=r.width, dtype=embeds.dtype, device=device, generator=generator)
        steps = r.num_inference_steps
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=steps)
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=flow_sigmas(pipe.scheduler, steps),
                                          mu=mu)
        pipe.scheduler.set_begin_index(0)
        guidance = torch.full([1], r.guidance_scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        branches = {COND: dict(encoder_hidden_states=embeds, txt_ids=text_ids)}
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(img_ids=latent_ids, guidance=guidance))

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents.to(self.pipe.transformer.dtype),
                    timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000, guidance=state.extra["guidance"],
                    img_ids=state.extra["img_ids"], joint_attention_kwargs=None, **state.branches[branch])

    def decode_latents(self, state, latents):
        pipe = self.pipe
        # Private: Flux2Pipeline has no public method that places [B, S, 4C] tokens back on the latent grid by
        # their ids, nor one that undoes its 2x2 patchify; both are what its __call__ runs before vae.decode.
        latents = pipe._unpack_latents_with_ids(latents, state.extra["img_ids"])
        bn = pipe.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps).to(
            latents.device, latents.dtype)
        return pipe._unpatchify_latents(latents * std + mean)


RECIPE = Flux2Recipe
