"""SANA (SanaPipeline / SanaTransformer2DModel): linear self-attention over the image, SDPA cross-attention to the
Gemma text, and a Mix-FFN whose depthwise 3x3 conv runs over the 2-D token grid; run without resolution binning.

Sequence parallelism splits the latent [B, C, h, w] into bands of whole rows (Split.rows, patch size 1), so the
model reads each band's height and every block's Mix-FFN sees a band of the grid: its conv gets the neighbouring
bands' edge rows (RowHalo). The linear self-attention never calls SDPA (NotSdpa): its exchange
(attention/linear.py) takes the K.V summary over every rank's tokens (Ulysses: all-to-all by heads; ring: an
all-reduce of the summaries). The text stays whole on every rank: cross-attention is LOCAL, its padding mask
applies unchanged.
"""
from __future__ import annotations

import inspect

import torch
from diffusers.pipelines.sana.pipeline_sana import retrieve_timesteps

from ..attention.linear import exchange_kv_summary
from ..parallel.plan import (LOCAL, BlockList, Gather, ModelPlan, NotSdpa, RowHalo, SequencePlan, Split, StagePlan)
from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe

PLAN = ModelPlan(
    SequencePlan(
        splits=(Split("", "hidden_states", -2, "img", rows=True),  # the latent's rows: [B, C, h / sp, w]
                # a ControlNet's per-block residuals [B, h * w, D] (run whole on every rank), added to the image
                # tokens: split into the tokens of this rank's row band
                Split("", "controlnet_block_samples", -2, "img", band_tokens=True)),
        gathers=(Gather("", -2, "img"),),  # the transformer's output [B, C, h / sp, w], unpatchified by the model
        attention={
            "transformer_blocks.*.attn1": NotSdpa(("img",), exchange_kv_summary),
            "transformer_blocks.*.attn2": LOCAL,
        },
        halos=(RowHalo("transformer_blocks.*.ff", "img", rows=1),),  # GLUMBConv: 1x1, depthwise 3x3, 1x1
    ),
    StagePlan(blocks=(BlockList("transformer_blocks", ("hidden_states",), "hidden_states"),)),
)


def default_complex_human_instruction(pipe) -> list[str]:
    """SanaPipeline.__call__'s own default instruction prepended to every prompt (no public attribute holds it)."""
    return inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default


class SanaRecipe(Recipe):
    batch_branches = True

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        instruction = r.extra.get("complex_human_instruction", default_complex_human_instruction(pipe))
        embeds, mask, n_embeds, n_mask = pipe.encode_prompt(
            r.prompts, cfg, negative_prompt=r.negative_prompt or "", num_images_per_prompt=r.num_images_per_prompt,
            device=device, clean_caption=False, max_sequence_length=r.extra["max_sequence_length"],
            complex_human_instruction=instruction)
        branches = {COND: dict(encoder_hidden_states=embeds, encoder_attention_mask=mask)}
        if cfg:
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, encoder_attention_mask=n_mask), **branches}
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device)
        latents = pipe.prepare_latents(embeds.shape[0], pipe.transformer.config.in_channels, r.height, r.width,
                                       torch.float32, device, generator)  # [B, C, h, w], float32 as the pipeline's
        step_kwargs = pipe.prepare_extra_step_kwargs(generator, 0.0)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(step_kwargs=step_kwargs))

    def model_inputs(self, state, latents, t, branch):
        transformer = self.pipe.transformer
        dtype = transformer.dtype
        kwargs = state.branches[branch]
        timestep = t.expand(latents.shape[0]) * transformer.config.timestep_scale
        return dict(hidden_states=latents.to(dtype), timestep=timestep, attention_kwargs=None,
                    encoder_hidden_states=kwargs["encoder_hidden_states"].to(dtype),
                    encoder_attention_mask=kwargs["encoder_attention_mask"])

    def postprocess_prediction(self, state, pred):
        pred = pred.float()
        channels = self.pipe.transformer.config.in_channels
        if self.pipe.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the noise half
            pred = pred.chunk(2, dim=1)[0]
        return pred

    def step(self, state, noise_pred, t, latents):
        return self.pipe.scheduler.step(noise_pred, t, latents, **state.extra["step_kwargs"], return_dict=False)[0]

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor


RECIPE = SanaRecipe
