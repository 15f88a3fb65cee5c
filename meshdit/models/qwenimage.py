"""Qwen-Image (QwenImagePipeline, QwenImageEditPipeline / QwenImageTransformer2DModel): double-stream blocks whose
joint attention sees [text, image] (Qwen2.5-VL text, its padding masked when prompts of a batch differ in length),
rotary embeddings per stream from one module (QwenEmbedRope: image freqs, text freqs), 2 x 2 packed latents, a
causal 3-D VAE (AutoencoderKLQwenImage) on [B, C, 1, h, w].

Guidance: --guidance-scale is the pipeline's true_cfg_scale. Above 1 two branches run, with --negative-prompt ("" when
none is given; the pipeline runs true CFG only when a negative prompt is passed), combined as diffusers does and
rescaled per token to the conditional prediction's norm; at 1 one branch runs (the pipeline without a negative
prompt).

Editing (QwenImageEditPipeline): the input image goes into the text encoder (Qwen2.5-VL with its processor) and, as
VAE latents at about 1024 x 1024 pixels, after the noise tokens in the image stream (img_shapes lists both grids).
Those reference tokens are split with the image stream (one tensor, one rotary table: per-token arithmetic, exact
under Ulysses and ring). PipeFusion's patches are rows of the latent grid and cannot cut tokens after it: its
whole-grid windows keep them (full warmup: exact), and patch steps are refused before ranks start (the row's
image_tokens_after_grid_pipelines).
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from diffusers.utils import load_image

from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe
from ..parallel.plan import (OUTPUT, BlockList, Gather, MaskedTail, ModelPlan, SequencePlan, Split, StagePlan,
                             TensorPlan)

# The image tokens are split where the blocks take them (diffusers' _cp_plan does so too), the image rotary freqs
# where the rope module returns them. The text stays whole on every rank with its rotary freqs: each attention sees
# [whole text, image shard], the text's padding (a batch of prompts of different lengths) masked: a leading
# MaskedTail, whose kept text tokens the attention deals out over the SP ranks and gathers back.
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("transformer_blocks.0", "hidden_states", -2, "img"),
            Split("pos_embed", OUTPUT, -2, "img", item=0),
            # a ControlNet's per-block residuals [B, S_img, D] (run whole on every rank), added to the image tokens
            Split("", "controlnet_block_samples", -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={"*": MaskedTail(("img",), "txt", leading=True)},
    ),
    StagePlan(blocks=(
        BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                  ("encoder_hidden_states", "hidden_states")),
    )),
    # tensor parallelism: diffusers' _tp_plan on QwenImageTransformer2DModel (Q/K/V and MLPs of both streams), plus
    # the two streams' adaLN modulation split and gathered (a third of a block's weights, which _tp_plan leaves whole)
    TensorPlan(gathered=("transformer_blocks.*.img_mod.1", "transformer_blocks.*.txt_mod.1")),
)


class QwenImageRecipe(Recipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        prompts, n, max_len = r.prompts, r.num_images_per_prompt, r.extra["max_sequence_length"]
        edit = {}
        if r.image is not None:  # QwenImageEditPipeline: the image to the text encoder, and as reference latents
            image = load_image(r.image)  # a path (or the PIL image the Python API passes) -> RGB PIL
            ref_width, ref_height, _ = calculate_dimensions(1024 * 1024, image.size[0] / image.size[1])
            image = pipe.image_processor.resize(image, ref_height, ref_width)
            edit = dict(image=image)
        embeds, mask = pipe.encode_prompt(prompt=prompts, device=device, num_images_per_prompt=n,
                                          max_sequence_length=max_len, **edit)
        branches = {COND: dict(encoder_hidden_states=embeds, encoder_hidden_states_mask=mask)}
        if r.guidance_scale > 1:
            negative = [r.negative_prompt or ""] * len(prompts)
            n_embeds, n_mask = pipe.encode_prompt(prompt=negative, device=device, num_images_per_prompt=n,
                                                  max_sequence_length=max_len, **edit)
            branches[UNCOND] = dict(encoder_hidden_states=n_embeds, encoder_hidden_states_mask=n_mask)
        channels, batch = pipe.transformer.config.in_channels // 4, len(prompts) * n
        grid = (1, r.height // pipe.vae_scale_factor // 2, r.width // pipe.vae_scale_factor // 2)
        if edit:
            pixels = pipe.image_processor.preprocess(edit["image"], ref_height, ref_width).unsqueeze(2)
            latents, image_latents = pipe.prepare_latents(pixels, batch, channels, r.height, r.width, embeds.dtype,
                                                          device, generator)  # [B, S, 4C] each
            img_shapes = [[grid, (1, ref_height // pipe.vae_scale_factor // 2,
                                  ref_width // pipe.vae_scale_factor // 2)]]
        else:
            latents = pipe.prepare_latents(batch, channels, r.height, r.width, embeds.dtype, device, generator)
            image_latents, img_shapes = None, [[grid]]
        cfg = pipe.scheduler.config
        mu = calculate_shift(latents.shape[1], cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        steps = r.num_inference_steps
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 1 / steps, steps),
                                          mu=mu)
        pipe.scheduler.set_begin_index(0)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(image_latents=image_latents, img_shapes=img_shapes,
                                       noise_tokens=latents.shape[1]))

    def model_inputs(self, state, latents, t, branch):
        reference = state.extra["image_latents"]
        hidden = latents if reference is None else torch.cat([latents, reference], dim=1)  # [B, S + S_ref, 4C]
        return dict(hidden_states=hidden, timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                    guidance=None, img_shapes=state.extra["img_shapes"], attention_kwargs={},
                    **state.branches[branch])

    def postprocess_prediction(self, state, pred):
        return pred[:, :state.extra["noise_tokens"]]  # the noise tokens' prediction (edit: not the reference's)

    def guide(self, state, preds):
        if UNCOND not in preds:
            return preds[COND]
        cond, uncond = preds[COND], preds[UNCOND]
        combined = uncond + state.guidance_scale * (cond - uncond)
        # rescaled per token to the conditional prediction's norm, op for op as the pipeline does
        return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))

    def decode_latents(self, state, latents):
        pipe, vae = self.pipe, self.pipe.vae
        # Private: the pipeline has no public method that unpacks [B, S, 4C] tokens into [B, C, 1, h, w].
        latents = pipe._unpack_latents(latents, state.height, state.width, pipe.vae_scale_factor).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        return latents / inverse_std + mean  # the pipeline's arithmetic, op for op (bit-equal output)

    def postprocess(self, decoded, output_type):
        return super().postprocess(decoded[:, :, 0], output_type)  # [B, 3, 1, H, W]: the one frame


RECIPE = QwenImageRecipe
