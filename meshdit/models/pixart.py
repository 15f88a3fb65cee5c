"""PixArt-α and PixArt-Σ (PixArtAlphaPipeline, PixArtSigmaPipeline / PixArtTransformer2DModel): image
self-attention, cross-attention to text; run without resolution binning."""
from __future__ import annotations

import torch
from diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha import retrieve_timesteps

from ..parallel.plan import (COLUMN, LOCAL, OUTPUT, ROW, BlockList, Gather, ModelPlan, StagePlan, SequencePlan, Split,
                             TensorPlan)
from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe

# Text stays whole on every rank: cross-attention needs no communication, and its padding mask
# applies unchanged.
PLAN = ModelPlan(
    SequencePlan(
        splits=(Split("pos_embed", OUTPUT, -2, "img"),),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "transformer_blocks.*.attn1": ("img",),
            "transformer_blocks.*.attn2": LOCAL,
        },
    ),
    StagePlan(blocks=(BlockList("transformer_blocks", ("hidden_states",), "hidden_states"),)),
    # tensor parallelism (diffusers has no _tp_plan for PixArt): self- and cross-attention by heads, the MLP;
    # the adaLN-single modulation is a [6, D] table per block, left whole
    TensorPlan({
        "transformer_blocks.*.attn*.to_[qkv]": COLUMN,
        "transformer_blocks.*.attn*.to_out.0": ROW,
        "transformer_blocks.*.ff.net.0.proj": COLUMN,
        "transformer_blocks.*.ff.net.2": ROW,
    }),
)


class PixArtRecipe(Recipe):
    batch_branches = True

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        alpha = type(pipe).__name__ == "PixArtAlphaPipeline"
        embeds, mask, n_embeds, n_mask = pipe.encode_prompt(
            r.prompts, cfg, negative_prompt=r.negative_prompt or "", num_images_per_prompt=r.num_images_per_prompt,
            device=device, clean_caption=False, max_sequence_length=r.extra["max_sequence_length"])
        batch = embeds.shape[0]
        added = {"resolution": None, "aspect_ratio": None}
        if alpha and pipe.transformer.config.sample_size == 128:  # PixArt-α 1024 px conditions on size
            added = {
                "resolution": torch.tensor([r.height, r.width]).repeat(batch, 1).to(embeds.dtype),
                "aspect_ratio": torch.tensor([float(r.height / r.width)]).repeat(batch, 1).to(embeds.dtype),
            }
        branches = {COND: dict(encoder_hidden_states=embeds, encoder_attention_mask=mask, added_cond_kwargs=added)}
        if cfg:
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, encoder_attention_mask=n_mask,
                                     added_cond_kwargs=added), **branches}
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, "cpu" if cfg else device)
        latents = pipe.prepare_latents(batch, pipe.transformer.config.in_channels, r.height, r.width, embeds.dtype,
                                       device, generator)  # [B, C, h, w]
        if alpha and hasattr(pipe.scheduler, "set_begin_index"):
            pipe.scheduler.set_begin_index(0)
        step_kwargs = pipe.prepare_extra_step_kwargs(generator, 0.0)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(step_kwargs=step_kwargs, alpha=alpha, steps=r.num_inference_steps))

    def model_inputs(self, state, latents, t, branch):
        latents = self.pipe.scheduler.scale_model_input(latents, t)
        timestep = t[None].to(latents.device) if t.dim() == 0 else t
        return dict(hidden_states=latents, timestep=timestep.expand(latents.shape[0]), **state.branches[branch])

    def postprocess_prediction(self, state, pred):
        channels = self.pipe.transformer.config.in_channels
        if self.pipe.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the noise half
            pred = pred.chunk(2, dim=1)[0]
        return pred

    def step(self, state, noise_pred, t, latents):
        out = self.pipe.scheduler.step(noise_pred, t, latents, **state.extra["step_kwargs"], return_dict=False)
        # PixArt-α's one-step sampling takes the scheduler's denoised estimate
        return out[1] if state.extra["alpha"] and state.extra["steps"] == 1 else out[0]

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor


RECIPE = PixArtRecipe
