"""Chroma (ChromaPipeline / ChromaTransformer2DModel): FLUX.1's blocks without guidance embedding, every block's
modulation read from one table the approximator (`distilled_guidance_layer`) makes from the timestep, true
classifier-free guidance with a negative prompt, and a mask over the T5 prompt's padding in the joint attention.

The pipeline keeps the prompt's tokens up to and including the first padding token (m = 1) and masks the rest
(m = 0); the transformer gets m over [text, image] (image tokens 1) and every block hands SDPA the float mask
m_i * m_j, which SDPA adds to the scores (diffusers 0.42; see parallel/plan.TokenMask).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from diffusers.pipelines.chroma.pipeline_chroma import calculate_shift, retrieve_timesteps

from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe
from ..parallel.plan import COLUMN, ROW, BlockList, ModelPlan, Packed, StagePlan, TensorPlan, TokenMask
from .flux import SEQUENCE_PLAN as FLUX_SEQUENCE_PLAN

# As FLUX.1: text and image tokens both split, their ids with them, so the rotary table the model builds from
# cat(txt_ids, img_ids) matches the local tokens; every attention sees [txt, img]. The mask input [B, L + S]
# stays whole: every block builds the whole m_i * m_j from it, and the attention takes its local tokens' m.
PLAN = ModelPlan(
    replace(FLUX_SEQUENCE_PLAN, attention={"*": TokenMask(("txt", "img"))}),
    StagePlan(blocks=(
        BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                  ("encoder_hidden_states", "hidden_states")),
        # a single block takes cat(text, image) and returns it
        BlockList("single_transformer_blocks", ("hidden_states",), "hidden_states"),
    )),
    # tensor parallelism: FLUX.1's _tp_plan (diffusers gives Chroma none); the modulation comes from the
    # approximator's table outside the blocks, so no block holds a modulation Linear
    TensorPlan({
        "transformer_blocks.*.attn.to_[qkv]": COLUMN,
        "transformer_blocks.*.attn.add_[qkv]_proj": COLUMN,
        "transformer_blocks.*.attn.to_out.0": ROW,
        "transformer_blocks.*.attn.to_add_out": ROW,
        "transformer_blocks.*.ff*.net.0.proj": COLUMN,
        "transformer_blocks.*.ff*.net.2": ROW,
        "single_transformer_blocks.*.attn.to_[qkv]": COLUMN,
        "single_transformer_blocks.*.proj_mlp": COLUMN,
        "single_transformer_blocks.*.proj_out": Packed(ROW, (1, 4)),  # reads cat(attention, MLP 4 x wider)
    }),
)


class ChromaRecipe(Recipe):
    unbatched_keys = ("txt_ids", "img_ids")  # [S, 3] ids without a batch dim

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        negative = [r.negative_prompt or ""] * len(r.prompts) if cfg else None
        embeds, text_ids, mask, n_embeds, n_text_ids, n_mask = pipe.encode_prompt(  # [B, L, D], [L, 3], [B, L]
            prompt=r.prompts, negative_prompt=negative, do_classifier_free_guidance=cfg, device=device,
            num_images_per_prompt=r.num_images_per_prompt, max_sequence_length=r.extra["max_sequence_length"])
        latents, image_ids = pipe.prepare_latents(  # [B, S, 4C] packed, [S, 3]
            len(r.prompts) * r.num_images_per_prompt, pipe.transformer.config.in_channels // 4, r.height, r.width,
            embeds.dtype, device, generator)
        batch, tokens = latents.shape[:2]

        def branch(embeds, ids, mask):  # the mask over [text, image] (private: the pipeline's own extension)
            return dict(encoder_hidden_states=embeds, txt_ids=ids, attention_mask=pipe._prepare_attention_mask(
                batch_size=batch, sequence_length=tokens, dtype=latents.dtype, attention_mask=mask))

        branches = {COND: branch(embeds, text_ids, mask)}
        if cfg:
            branches[UNCOND] = branch(n_embeds, n_text_ids, n_mask)
        cfg_ = pipe.scheduler.config
        mu = calculate_shift(tokens, cfg_.get("base_image_seq_len", 256), cfg_.get("max_image_seq_len", 4096),
                             cfg_.get("base_shift", 0.5), cfg_.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device,
                                          sigmas=np.linspace(1.0, 1 / r.num_inference_steps, r.num_inference_steps),
                                          mu=mu)  # the pipeline's default sigmas
        pipe.scheduler.set_begin_index(0)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(img_ids=image_ids))

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                    img_ids=state.extra["img_ids"], joint_attention_kwargs={}, **state.branches[branch])

    def decode_latents(self, state, latents):
        pipe = self.pipe
        # Private: ChromaPipeline has no public method that unpacks [B, S, 4C] tokens into [B, C, h, w].
        latents = pipe._unpack_latents(latents, state.height, state.width, pipe.vae_scale_factor)
        return latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor


RECIPE = ChromaRecipe
