"""FLUX.1 (FluxPipeline / FluxTransformer2DModel): joint text+image attention, RoPE ids given as inputs.

Guidance-distilled models (guidance_embeds, e.g. -dev) embed the guidance scale; the others use true
classifier-free guidance with a negative prompt ("" by default).
"""
from __future__ import annotations

import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

from ..parallel.plan import BlockList, Gather, ModelPlan, StagePlan, SequencePlan, Split, TensorPlan
from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe, flow_sigmas

# Text and image tokens are both sharded; ids are sharded like their tokens, so the RoPE table the
# model builds from cat(txt_ids, img_ids) matches the local tokens. Every attention sees [txt, img].
SEQUENCE_PLAN = SequencePlan(
    splits=(
        Split("", "hidden_states", -2, "img"),
        Split("", "encoder_hidden_states", -2, "txt"),
        Split("", "img_ids", -2, "img"),
        Split("", "txt_ids", -2, "txt"),
        # a ControlNet's per-block residuals [B, S_img, D] (FluxControlNet* pipelines: the ControlNet runs whole on
        # every rank), added to the image tokens inside the block loop: split like them
        Split("", "controlnet_block_samples", -2, "img"),
        Split("", "controlnet_single_block_samples", -2, "img"),
    ),
    gathers=(Gather("proj_out", -2, "img"),),
    attention={"*": ("txt", "img")},
)

PLAN = ModelPlan(SEQUENCE_PLAN, StagePlan(blocks=(
    BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    BlockList("single_transformer_blocks", ("hidden_states", "encoder_hidden_states"),
              ("encoder_hidden_states", "hidden_states")),
    # tensor parallelism: diffusers' _tp_plan on FluxTransformer2DModel, plus the adaLN modulation split and gathered
)), TensorPlan(gathered=("transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
                         "single_transformer_blocks.*.norm.linear")))


class FluxRecipe(Recipe):
    unbatched_keys = ("txt_ids", "img_ids")  # [S, 3] ids without a batch dim

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        prompts, n, max_len = r.prompts, r.num_images_per_prompt, r.extra["max_sequence_length"]
        distilled = pipe.transformer.config.guidance_embeds
        embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=n, max_sequence_length=max_len)
        branches = {COND: dict(encoder_hidden_states=embeds, pooled_projections=pooled, txt_ids=text_ids)}
        if not distilled and r.guidance_scale > 1:
            negative = [r.negative_prompt or ""] * len(prompts)
            n_embeds, n_pooled, n_ids = pipe.encode_prompt(
                prompt=negative, prompt_2=None, device=device, num_images_per_prompt=n, max_sequence_length=max_len)
            branches[UNCOND] = dict(encoder_hidden_states=n_embeds, pooled_projections=n_pooled, txt_ids=n_ids)
        latents, image_ids, extra = self.prepare_latents(r, len(prompts) * n, embeds.dtype, device, generator)
        cfg = pipe.scheduler.config
        mu = calculate_shift(latents.shape[1], cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device,
                                          sigmas=flow_sigmas(pipe.scheduler, r.num_inference_steps), mu=mu)
        pipe.scheduler.set_begin_index(0)
        guidance = None
        if distilled:
            guidance = torch.full([1], r.guidance_scale, device=device, dtype=torch.float32).expand(latents.shape[0])
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(img_ids=image_ids, guidance=guidance, **extra))

    def prepare_latents(self, r, batch, dtype, device, generator):
        """The starting latents [B, S, 4C] (packed), the image tokens' ids [S, 3], and state extras (none here)."""
        pipe = self.pipe
        latents, image_ids = pipe.prepare_latents(
            batch, pipe.transformer.config.in_channels // 4, r.height, r.width, dtype, device, generator)
        return latents, image_ids, {}

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                    guidance=state.extra["guidance"], img_ids=state.extra["img_ids"], joint_attention_kwargs={},
                    **state.branches[branch])

    def decode_latents(self, state, latents):
        pipe = self.pipe
        # Private: FluxPipeline has no public method that unpacks [B, S, 4C] tokens into [B, C, h, w].
        latents = pipe._unpack_latents(latents, state.height, state.width, pipe.vae_scale_factor)
        return latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor


RECIPE = FluxRecipe
