"""HunyuanVideo (HunyuanVideoPipeline / HunyuanVideoTransformer3DModel): text-to-video, dual-stream then
single-stream blocks whose joint attention appends the prompt's tokens (Llama, refined by the model's token
refiner) after the video tokens, with a key mask hiding the prompt's padding; 3-D rotary embeddings.

HunyuanVideo is guidance-distilled (guidance_embeds): the guidance scale is embedded and one branch runs. A
transformer without guidance_embeds runs true classifier-free guidance instead, as the pipeline's
true_cfg_scale with a negative prompt ("" by default) does: --guidance-scale is then that scale.

Image-to-video (HunyuanVideoImageToVideoPipeline, image_condition_type "latent_concat"): the text encoder is LLaVA,
which sees the image too; its image tokens (every image_embed_interleave-th) come first in the prompt, all kept, so
they are part of the prompt stream every rank holds whole. The image's latents join the noisy latents' channels with
a first-frame mask ([B, 2C + 1, F, h, w]), split with the video tokens. The decoded video loses its first 4 frames,
as the pipeline's do. "token_replace" models are refused before ranks start (models/registry.py).
"""
from __future__ import annotations

import numpy as np
import PIL.Image
import torch
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import retrieve_timesteps
from diffusers.utils import load_image

from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe
from ..parallel.plan import LOCAL, OUTPUT, BlockList, Gather, MaskedTail, ModelPlan, SequencePlan, Split, StagePlan

# The video tokens are split where the patch embedding returns them ([B, S, D], frame-major), the rotary
# table (cos, sin), each [S, D], where the rope module returns it. The prompt stays whole on every rank: the
# token refiner (its own masked self-attention, local) needs all of it, and the model builds the joint
# attention's key mask from the local video length and the whole prompt's valid length. So every joint
# attention sees [video shard, whole prompt] with the prompt's padding masked: a MaskedTail, whose kept
# tokens the attention deals out over the SP ranks and gathers back (no mask inside SP attention).
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("x_embedder", OUTPUT, -2, "img"),
            Split("rope", OUTPUT, -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "context_embedder.*": LOCAL,
            "*": MaskedTail(("img",), "txt"),
        },
    ),
    StagePlan(blocks=(
        BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                  ("hidden_states", "encoder_hidden_states")),
        BlockList("single_transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                  ("hidden_states", "encoder_hidden_states")),
    )),
)


class HunyuanVideoRecipe(VideoRecipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        dtype = pipe.transformer.dtype

        # the pipeline's prompt_template (--extra prompt_template=...), else encode_prompt's default
        template = {"prompt_template": r.extra["prompt_template"]} if "prompt_template" in r.extra else {}

        def branch(prompts):
            embeds, pooled, mask = pipe.encode_prompt(  # [B, L, D], [B, P], [B, L]
                prompt=prompts, num_videos_per_prompt=r.num_images_per_prompt, device=device,
                max_sequence_length=r.extra["max_sequence_length"], **template)
            return dict(encoder_hidden_states=embeds.to(dtype), encoder_attention_mask=mask.to(dtype),
                        pooled_projections=pooled.to(dtype))

        branches = {COND: branch(r.prompts)}
        if not pipe.transformer.config.guidance_embeds and r.guidance_scale > 1:
            branches[UNCOND] = branch([r.negative_prompt or ""] * len(r.prompts))
        timesteps = self.timesteps(r, device)
        batch = len(r.prompts) * r.num_images_per_prompt
        latents = pipe.prepare_latents(  # [B, C, F, h, w], fp32 as the pipeline keeps them
            batch, pipe.transformer.config.in_channels, r.height, r.width, r.num_frames, torch.float32, device,
            generator)
        # [B]: embedded by a distilled transformer, ignored by one without guidance_embeds (as in the pipeline)
        guidance = torch.tensor([r.guidance_scale] * batch, dtype=dtype, device=device) * 1000.0
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(guidance=guidance, num_frames=r.num_frames))

    def timesteps(self, r, device):
        """The pipelines' default schedule (sigmas from 1 down, no final 0)."""
        sigmas = np.linspace(1.0, 0.0, r.num_inference_steps + 1)[:-1]
        timesteps, _ = retrieve_timesteps(self.pipe.scheduler, r.num_inference_steps, device, sigmas=sigmas)
        self.pipe.scheduler.set_begin_index(0)
        return timesteps

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents.to(self.pipe.transformer.dtype),
                    timestep=t.expand(latents.shape[0]).to(latents.dtype), guidance=state.extra["guidance"],
                    attention_kwargs=None, **state.branches[branch])

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor


class HunyuanVideoImageToVideoRecipe(HunyuanVideoRecipe):
    """HunyuanVideoImageToVideoPipeline with a latent_concat transformer. Beyond the pipeline (batch 1 only): several
    prompts and videos per prompt, each video with the image's latents and each prompt with the image."""

    DROPPED_FRAMES = 4
    """Decoded frames the pipeline drops from the front of a latent_concat video."""

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        dtype = pipe.transformer.dtype
        image = load_image(r.image)
        template = {"prompt_template": r.extra["prompt_template"]} if "prompt_template" in r.extra else {}
        per_prompt = r.num_images_per_prompt

        def branch(prompts, picture):
            # [B, I + L, D] (I image tokens, kept, before the text), [B, P], [B, I + L]; one image per prompt (the
            # pipeline's LLaVA call takes as many as prompts); the pipeline's default interleave for latent_concat
            embeds, pooled, mask = pipe.encode_prompt(
                image=[picture] * len(prompts), prompt=prompts, device=device,
                max_sequence_length=r.extra["max_sequence_length"], **template)
            rows = dict(encoder_hidden_states=embeds, encoder_attention_mask=mask, pooled_projections=pooled)
            return {k: v.repeat_interleave(per_prompt, dim=0).to(dtype) for k, v in rows.items()}

        branches = {COND: branch(r.prompts, image)}
        if not pipe.transformer.config.guidance_embeds and r.guidance_scale > 1:
            # the pipeline's true CFG: the negative prompt with a black image
            black = PIL.Image.new("RGB", (r.width, r.height), 0)
            branches[UNCOND] = branch([r.negative_prompt or ""] * len(r.prompts), black)
        timesteps = self.timesteps(r, device)
        batch = len(r.prompts) * per_prompt
        pixels = pipe.video_processor.preprocess(image, r.height, r.width).to(device, pipe.vae.dtype)  # [1, 3, H, W]
        channels = (pipe.transformer.config.in_channels - 1) // 2
        # latents [B, C, F, h, w] (noise with a 0.001 share of the image's latents), image_latents [1, C, F, h, w]
        latents, image_latents = pipe.prepare_latents(pixels, batch, channels, r.height, r.width, r.num_frames,
                                                      torch.float32, device, generator, None, "latent_concat")
        image_latents[:, :, 1:] = 0  # the first frame's latents only, then the mask of that frame, as the pipeline
        mask = image_latents.new_ones(image_latents.shape[0], 1, *image_latents.shape[2:])  # [1, 1, F, h, w]
        mask[:, :, 1:] = 0
        condition = torch.cat([image_latents, mask], dim=1).expand(batch, -1, -1, -1, -1)  # [B, C + 1, F, h, w]
        guidance = torch.tensor([r.guidance_scale] * batch, dtype=dtype, device=device) * 1000.0
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(guidance=guidance, num_frames=r.num_frames, condition=condition))

    def model_inputs(self, state, latents, t, branch):
        inputs = super().model_inputs(state, latents, t, branch)
        # [B, 2C + 1, F, h, w]: the pipeline's torch.cat([latents, image_latents, mask]) in the transformer's dtype
        inputs["hidden_states"] = torch.cat([latents, state.extra["condition"]], dim=1).to(
            self.pipe.transformer.dtype)
        return inputs

    def postprocess(self, decoded, output_type):
        return super().postprocess(decoded[:, :, self.DROPPED_FRAMES:], output_type)


RECIPE = HunyuanVideoRecipe
RECIPES = {"HunyuanVideoImageToVideoPipeline": HunyuanVideoImageToVideoRecipe}
