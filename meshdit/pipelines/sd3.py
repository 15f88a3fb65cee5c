"""Stable Diffusion 3 / 3.5 (StableDiffusion3Pipeline)."""
from __future__ import annotations

from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift, retrieve_timesteps

from .recipe import COND, UNCOND, DenoiseState, Recipe


class SD3Recipe(Recipe):
    default_steps = 28
    default_guidance = 7.0
    batch_branches = True

    def prepare(self, request, generator, device):
        pipe = self.pipe
        height, width, steps, scale = self.settings(request)
        cfg = scale > 1
        embeds, n_embeds, pooled, n_pooled = pipe.encode_prompt(
            prompt=request.prompts, prompt_2=None, prompt_3=None, device=device,
            num_images_per_prompt=request.num_images_per_prompt, do_classifier_free_guidance=cfg,
            negative_prompt=request.negative_prompt,
            max_sequence_length=request.extra.get("max_sequence_length", 256))
        branches = {COND: dict(encoder_hidden_states=embeds, pooled_projections=pooled)}
        if cfg:  # uncond first: the order diffusers batches them in
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, pooled_projections=n_pooled), **branches}
        latents = pipe.prepare_latents(embeds.shape[0], pipe.transformer.config.in_channels, height, width,
                                       embeds.dtype, device, generator)
        kwargs = {}
        sc = pipe.scheduler.config
        if sc.get("use_dynamic_shifting", None):
            patch = pipe.transformer.config.patch_size
            seq = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            kwargs["mu"] = calculate_shift(seq, sc.get("base_image_seq_len", 256), sc.get("max_image_seq_len", 4096),
                                           sc.get("base_shift", 0.5), sc.get("max_shift", 1.16))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, **kwargs)
        return DenoiseState(latents, timesteps, branches, scale, height, width)

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]), joint_attention_kwargs=None,
                    **state.branches[branch])

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents / vae.config.scaling_factor + vae.config.shift_factor
