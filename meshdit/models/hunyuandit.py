"""HunyuanDiT (HunyuanDiTPipeline / HunyuanDiT2DModel): image self-attention with 2D rotary embeddings,
cross-attention to BERT + T5 text, and U-Net-like long skips from the first half of the blocks to the
second. Run without resolution binning."""
from __future__ import annotations

import torch
from diffusers.models.embeddings import get_2d_rotary_pos_embed
from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

from ..parallel.plan import (COLUMN, GATHERED, LOCAL, OUTPUT, ROW, BlockList, Gather, ModelPlan, StagePlan,
                             SequencePlan, Split, TensorPlan)
from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe


def _long_skips(num_blocks: int) -> tuple[tuple[int, int], ...]:
    # HunyuanDiT2DModel.forward pushes the outputs of blocks 0 .. n/2-2 and pops one into each block
    # n/2+1 .. n-1: block j takes block n-1-j's output.
    return tuple((num_blocks - 1 - j, j) for j in range(num_blocks // 2 + 1, num_blocks))


# Image tokens are sharded at the patch embedding's output, the rotary table (cos, sin), each
# [S, D], with them (or kept whole where it has one row: the pipeline's grid assumes a VAE factor of 8,
# and a smaller VAE can give a 1 x 1 grid, which the model broadcasts); text stays whole on every rank
# (cross-attention needs no communication).
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("pos_embed", OUTPUT, -2, "img"),
            Split("", "image_rotary_emb", -2, "img", table=True),
            # a ControlNet's residuals [B, S_img, D] (run whole on every rank), added to the long skips' image tokens
            Split("", "controlnet_block_samples", -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "blocks.*.attn1": ("img",),
            "blocks.*.attn2": LOCAL,
        },
    ),
    StagePlan(blocks=(BlockList("blocks", ("hidden_states",), "hidden_states", long_skips=_long_skips),)),
    # tensor parallelism (diffusers has no _tp_plan for HunyuanDiT): self- and cross-attention by heads (Q/K
    # LayerNorms per head), the MLP, the shift modulation gathered; the long skips' skip_linear reads the whole
    # LayerNorm of cat(x, skip) and stays whole
    TensorPlan({
        "blocks.*.attn[12].to_[qkv]": COLUMN,
        "blocks.*.attn[12].to_out.0": ROW,
        "blocks.*.ff.net.0.proj": COLUMN,
        "blocks.*.ff.net.2": ROW,
        "blocks.*.norm1.linear": GATHERED,
    }),
)


class HunyuanDiTRecipe(Recipe):
    batch_branches = True

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        transformer = pipe.transformer
        text = {}
        # BERT, then T5, at the text lengths the transformer's padding table is built for (77 and 256:
        # what the pipeline passes).
        for index, suffix, length in ((0, "", transformer.config.text_len),
                                      (1, "_t5", transformer.config.text_len_t5)):
            embeds, n_embeds, mask, n_mask = pipe.encode_prompt(
                prompt=r.prompts, device=device, dtype=transformer.dtype, num_images_per_prompt=r.num_images_per_prompt,
                do_classifier_free_guidance=cfg, negative_prompt=r.negative_prompt, max_sequence_length=length,
                text_encoder_index=index)
            text[COND, "encoder_hidden_states" + suffix] = embeds  # [B, L, D]
            text[COND, "text_embedding_mask" + suffix] = mask  # [B, L]
            text[UNCOND, "encoder_hidden_states" + suffix] = n_embeds
            text[UNCOND, "text_embedding_mask" + suffix] = n_mask
        embeds = text[COND, "encoder_hidden_states"]
        batch = embeds.shape[0]
        pipe.scheduler.set_timesteps(r.num_inference_steps, device=device)
        latents = pipe.prepare_latents(batch, transformer.config.in_channels, r.height, r.width, embeds.dtype,
                                       device, generator)  # [B, C, h, w]
        step_kwargs = pipe.prepare_extra_step_kwargs(generator, 0.0)
        # The pipeline's own grid arithmetic (it assumes a VAE factor of 8 and a 512 px base size).
        patch = transformer.config.patch_size
        grid = (r.height // 8 // patch, r.width // 8 // patch)
        rotary = get_2d_rotary_pos_embed(transformer.inner_dim // transformer.num_heads,
                                         get_resize_crop_region_for_grid(grid, 512 // 8 // patch), grid,
                                         device=device, output_type="pt")  # (cos, sin), each [S, D]
        meta = torch.tensor([[1024, 1024, r.height, r.width, 0, 0]], dtype=embeds.dtype)  # original, target, crop
        fixed = dict(image_meta_size=meta.to(device).repeat(batch, 1),  # [B, 6]
                     style=torch.tensor([0], device=device).repeat(batch))  # [B]
        names = [COND, UNCOND] if cfg else [COND]
        branches = {b: {**{k: v for (bb, k), v in text.items() if bb == b}, **fixed} for b in reversed(names)}
        return DenoiseState(latents, pipe.scheduler.timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(step_kwargs=step_kwargs, rotary=rotary))

    def model_inputs(self, state, latents, t, branch):
        latents = self.pipe.scheduler.scale_model_input(latents, t)
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.dtype),
                    image_rotary_emb=state.extra["rotary"], **state.branches[branch])

    def postprocess_prediction(self, state, pred):
        return pred.chunk(2, dim=1)[0]  # the noise half (the other is the learned variance), as the pipeline does

    def step(self, state, noise_pred, t, latents):
        return self.pipe.scheduler.step(noise_pred, t, latents, **state.extra["step_kwargs"], return_dict=False)[0]

    def decode_latents(self, state, latents):
        return latents / self.pipe.vae.config.scaling_factor


RECIPE = HunyuanDiTRecipe
