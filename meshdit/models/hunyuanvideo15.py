"""HunyuanVideo 1.5 (HunyuanVideo15Pipeline / HunyuanVideo15Transformer3DModel): text-to-video, dual-stream blocks
whose joint attention appends the prompt's tokens after the video tokens; 3-D rotary embeddings.

The model lays the prompt out as [kept image, kept ByT5, kept Qwen, image padding, ByT5 padding, Qwen padding]
(text-to-video: all 729 image tokens are padding), so every joint attention sees [video, 1000 + 256 + 729 text
tokens] whose kept tokens are a prefix of the text. Its processor masks query x key ([B, 1, N, N]: a padding
token neither attends nor is attended to; SDPA gives its row 0). Guidance is true CFG through the pipeline's
guider (ClassifierFreeGuidance, negative prompt "" by default); --guidance-scale defaults to the guider's scale.

Image-to-video (HunyuanVideo15ImageToVideoPipeline): SigLIP's embeddings of the image are the model's image tokens
(all kept, so they lead the prompt tail every rank holds whole, like the text); the first frame's VAE latents and a
first-frame mask are the condition channels ([B, 2C + 1, F, h, w]), split with the video tokens. The pipeline
renders at the size bucket of the image's aspect ratio; meshdit at --height / --width (the image resized and
cropped to it as the pipeline does), which equal the pipeline's video where they are that bucket.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import retrieve_timesteps
from diffusers.utils import load_image

from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe
from ..parallel.plan import ModelPlan, StagePlan
from .hunyuanvideo import PLAN as HUNYUANVIDEO_PLAN

# HunyuanVideo 1.0's sequence plan, unchanged: the video tokens split where the patch embedding returns them
# ([B, S, D], frame-major), the rotary table (cos, sin), each [S, D], where the rope module returns it; the whole
# prompt on every rank (the token refiner, local, needs all of it); each joint attention sees [video shard, whole
# prompt] with the prompt's padding masked: a MaskedTail (here the processor's query x key mask, checked as one
# token mask). The stages: dual-stream blocks only.
PLAN = ModelPlan(
    HUNYUANVIDEO_PLAN.sequence,
    StagePlan(blocks=HUNYUANVIDEO_PLAN.stages.blocks[:1]),  # 1.0's dual-stream list
)


class HunyuanVideo15Recipe(VideoRecipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        dtype = pipe.transformer.dtype
        batch = len(r.prompts) * r.num_images_per_prompt

        def branch(prompts):
            embeds, mask, embeds_2, mask_2 = pipe.encode_prompt(  # [B, 1000, D], [B, 1000], [B, 256, D2], [B, 256]
                prompt=prompts, device=device, dtype=dtype, batch_size=len(prompts),
                num_videos_per_prompt=r.num_images_per_prompt)
            return dict(encoder_hidden_states=embeds, encoder_attention_mask=mask,
                        encoder_hidden_states_2=embeds_2, encoder_attention_mask_2=mask_2)

        branches = {COND: branch(r.prompts)}
        if _runs_cfg(pipe.guider, r.guidance_scale):
            branches[UNCOND] = branch([r.negative_prompt or ""] * len(r.prompts))
        sigmas = np.linspace(1.0, 0.0, r.num_inference_steps + 1)[:-1]  # the pipeline's default schedule
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device, sigmas=sigmas)
        pipe.scheduler.set_begin_index(0)
        latents = pipe.prepare_latents(  # [B, C, F, h, w], in the transformer's dtype as the pipeline keeps them
            batch, pipe.num_channels_latents, r.height, r.width, r.num_frames, dtype, device, generator)
        # [B, 729, D_img] zeros: text-to-video (the model masks the image tokens when all are 0). The pipeline
        # makes len(prompts) rows, which is the batch for one video per prompt; one per video lets data
        # parallelism cut them with the batch.
        image_embeds = torch.zeros(batch, pipe.vision_num_semantic_tokens, pipe.vision_states_dim, dtype=dtype,
                                   device=device)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(image_embeds=image_embeds, num_frames=r.num_frames))

    def model_inputs(self, state, latents, t, branch):
        dtype = self.pipe.transformer.dtype
        # the condition latents and their mask channel: zeros for text-to-video, shaped like `latents` (a
        # PipeFusion patch too); [B, 2C + 1, F, h, w] in, as the pipeline builds it every step
        cond, mask = self.pipe.prepare_cond_latents_and_mask(latents, dtype, latents.device)
        hidden = torch.cat([latents, cond, mask], dim=1)
        return dict(hidden_states=hidden, image_embeds=state.extra["image_embeds"],
                    timestep=t.expand(hidden.shape[0]).to(hidden.dtype), attention_kwargs=None,
                    **state.branches[branch])

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor


class HunyuanVideo15ImageToVideoRecipe(HunyuanVideo15Recipe):
    """HunyuanVideo15ImageToVideoPipeline: text-to-video's branches, timesteps and noise, with the image's
    embeddings and first-frame condition."""

    def prepare_settings(self, r, generator, device):
        state = super().prepare_settings(r, generator, device)
        pipe = self.pipe
        dtype = pipe.transformer.dtype
        batch = state.batch_size
        image = pipe.video_processor.resize(load_image(r.image), height=r.height, width=r.width, resize_mode="crop")
        # [B, T, D_img]: SigLIP's last hidden states, one row per video (nonzero: the model keeps them all)
        state.extra["image_embeds"] = pipe.encode_image(image, batch, device, dtype)
        # [B, C, F, h, w] (the first frame's latents, zeros after) and [B, 1, F, h, w] (1 on the first frame)
        cond, mask = pipe.prepare_cond_latents_and_mask(state.latents, image, batch, r.height, r.width, dtype,
                                                        device)
        state.extra["condition"] = torch.cat([cond, mask], dim=1)
        return state

    def model_inputs(self, state, latents, t, branch):
        hidden = torch.cat([latents, state.extra["condition"]], dim=1)  # [B, 2C + 1, F, h, w], as the pipeline
        return dict(hidden_states=hidden, image_embeds=state.extra["image_embeds"],
                    timestep=t.expand(hidden.shape[0]).to(hidden.dtype), attention_kwargs=None,
                    **state.branches[branch])


def _runs_cfg(guider, scale: float) -> bool:
    """Whether the pipeline's guider runs the unconditional branch at `scale` (ClassifierFreeGuidance's rule); other
    guider settings change the branches per step or the combination, which this recipe does not follow."""
    config = guider.config
    if type(guider).__name__ != "ClassifierFreeGuidance" or (config.start, config.stop) != (0.0, 1.0) or \
            config.use_original_formulation or config.guidance_rescale:
        raise NotImplementedError(
            f"this HunyuanVideo15Pipeline's guider ({type(guider).__name__} {dict(config)}) is not plain "
            "classifier-free guidance over every step: meshdit runs ClassifierFreeGuidance with start 0, stop 1, "
            "guidance_rescale 0 and the diffusers formulation; save the pipeline with such a guider.")
    return guider.get_state()["enabled"] and not math.isclose(scale, 1.0)


RECIPE = HunyuanVideo15Recipe
RECIPES = {"HunyuanVideo15ImageToVideoPipeline": HunyuanVideo15ImageToVideoRecipe}
