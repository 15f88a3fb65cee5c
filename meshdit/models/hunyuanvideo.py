"""HunyuanVideo (HunyuanVideoPipeline / HunyuanVideoTransformer3DModel): text-to-video, dual-stream then
single-stream blocks whose joint attention appends the prompt's tokens (Llama, refined by the model's token
refiner) after the video tokens, with a key mask hiding the prompt's padding; 3-D rotary embeddings.

HunyuanVideo is guidance-distilled (guidance_embeds): the guidance scale is embedded and one branch runs. A
transformer without guidance_embeds runs true classifier-free guidance instead, as the pipeline's
true_cfg_scale with a negative prompt ("" by default) does: --guidance-scale is then that scale.
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import retrieve_timesteps

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
        sigmas = np.linspace(1.0, 0.0, r.num_inference_steps + 1)[:-1]  # the pipeline's default schedule
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device, sigmas=sigmas)
        pipe.scheduler.set_begin_index(0)
        batch = len(r.prompts) * r.num_images_per_prompt
        latents = pipe.prepare_latents(  # [B, C, F, h, w], fp32 as the pipeline keeps them
            batch, pipe.transformer.config.in_channels, r.height, r.width, r.num_frames, torch.float32, device,
            generator)
        # [B]: embedded by a distilled transformer, ignored by one without guidance_embeds (as in the pipeline)
        guidance = torch.tensor([r.guidance_scale] * batch, dtype=dtype, device=device) * 1000.0
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(guidance=guidance, num_frames=r.num_frames))

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents.to(self.pipe.transformer.dtype),
                    timestep=t.expand(latents.shape[0]).to(latents.dtype), guidance=state.extra["guidance"],
                    attention_kwargs=None, **state.branches[branch])

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor


RECIPE = HunyuanVideoRecipe
