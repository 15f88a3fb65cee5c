"""Wan 2.1 / 2.2 (WanPipeline, WanImageToVideoPipeline / WanTransformer3DModel): video self-attention with
3-D rotary embeddings, cross-attention to UMT5 text (and, image-to-video, to CLIP image embeddings).

Image-to-video feeds the model the noisy latents concatenated (channels) with the image's condition: a
frame mask and the VAE-encoded first frame followed by zeros, as WanImageToVideoPipeline builds them.

Wan 2.2 A14B is a WanPipeline with two experts: `transformer` denoises while t >= boundary_ratio x
num_train_timesteps, `transformer_2` after (diffusers' own switch); both carry the same parallel hooks.

Wan 2.2 TI2V-5B (model_index.json's expand_timesteps; its VAE compresses 16 x 16 pixels into 48 channels) gives
the model one timestep per token, [B, S]: the model turns it into per-token modulation [B, S, 6, D] for every
block and the output norm, so the timestep is split with the video tokens (as diffusers' _cp_plan does) and each
rank's modulation covers its own tokens. Image-to-video there has no condition channels: the first latent frame is
the image's latents (the pipeline's first_frame_mask, 0 on that frame), at timestep 0, in the model's input and in
the decoded latents.
"""
from __future__ import annotations

import torch

from ..parallel.plan import (ACROSS_HEADS, COLUMN, LOCAL, OUTPUT, ROW, BlockList, Gather, ModelPlan, StagePlan,
                             SequencePlan, Split, TensorPlan)
from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe

# The model patchifies [B, C, F, h, w] and flattens the F' x H' x W' tokens itself, then runs its blocks:
# the tokens are sharded where the first block takes them (as diffusers' _cp_plan does), the rotary table
# (cos, sin), each [1, S, 1, D], where the rope module returns it, and a per-token timestep [B, S] (TI2V) where the
# model takes it ([B] otherwise: no tokens, left whole). Text stays whole (cross-attention).
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("rope", OUTPUT, -3, "img"),
            Split("blocks.0", "hidden_states", -2, "img"),
            Split("", "timestep", -1, "img", expected_dims=2),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "blocks.*.attn1": ("img",),
            "blocks.*.attn2": LOCAL,
        },
    ),
    StagePlan(blocks=(BlockList("blocks", ("hidden_states",), "hidden_states"),)),
    # tensor parallelism (diffusers has no _tp_plan for Wan): self- and cross-attention by heads (the image
    # K/V of I2V too), their Q/K RMS norms over all heads with the mean square all-reduced, the FFN; the
    # modulation is a [1, 6, D] table per block, left whole
    TensorPlan({
        "blocks.*.attn[12].to_[qkv]": COLUMN,
        "blocks.*.attn2.add_[kv]_proj": COLUMN,
        "blocks.*.attn[12].to_out.0": ROW,
        "blocks.*.attn[12].norm_[qk]": ACROSS_HEADS,
        "blocks.*.attn2.norm_added_k": ACROSS_HEADS,
        "blocks.*.ffn.net.0.proj": COLUMN,
        "blocks.*.ffn.net.2": ROW,
    }),
)


class WanRecipe(VideoRecipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        embeds, n_embeds = pipe.encode_prompt(
            prompt=r.prompts, negative_prompt=r.negative_prompt, do_classifier_free_guidance=cfg,
            num_videos_per_prompt=r.num_images_per_prompt, max_sequence_length=r.extra["max_sequence_length"],
            device=device)  # [B, L, D] each
        transformer = self.transformer_for(None, None)
        dtype = transformer.dtype
        batch = embeds.shape[0]
        image = {}
        if r.image is not None and transformer.config.image_dim is not None:  # CLIP embeddings of the image
            # [B, N, D]: one row per video (the pipeline repeats them per prompt, not per video)
            image = dict(encoder_hidden_states_image=pipe.encode_image(_load(r.image), device)
                         .repeat(batch, 1, 1).to(dtype))
        branches = {COND: dict(encoder_hidden_states=embeds.to(dtype), **image)}
        if cfg:
            branches[UNCOND] = dict(encoder_hidden_states=n_embeds.to(dtype), **image)
        pipe.scheduler.set_timesteps(r.num_inference_steps, device=device)
        condition = frame_mask = None
        if r.image is None:
            latents = pipe.prepare_latents(  # [B, C, F, h, w], fp32 as the pipeline keeps them
                batch, transformer.config.in_channels, r.height, r.width, r.num_frames, torch.float32, device,
                generator)
            pipe.scheduler.set_begin_index(0)  # WanPipeline does; WanImageToVideoPipeline finds the index by t
            if pipe.config.get("expand_timesteps"):  # TI2V: every token at t (WanPipeline's all-ones mask)
                frame_mask = torch.ones(latents.shape, dtype=torch.float32, device=device)
        else:
            pixels = pipe.video_processor.preprocess(_load(r.image), height=r.height, width=r.width).to(
                device, dtype=torch.float32)  # [1, 3, H, W]
            # latents [B, z, F, h, w]; condition [B, T + z, F, h, w]: the first frame's mask, then its latents;
            # TI2V: condition [B, z, 1, h, w], the image's latents, and frame_mask [1, 1, F, h, w], 0 on frame 0
            latents, condition, *mask = pipe.prepare_latents(pixels, batch, pipe.vae.config.z_dim, r.height,
                                                             r.width, r.num_frames, torch.float32, device, generator)
            frame_mask = mask[0] if mask else None
        ratio = pipe.config.boundary_ratio
        boundary = None if ratio is None else ratio * pipe.scheduler.config.num_train_timesteps
        return DenoiseState(latents, pipe.scheduler.timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(boundary=boundary, num_frames=r.num_frames, condition=condition,
                                       frame_mask=frame_mask))

    def transformer_for(self, state, t):
        # diffusers: `transformer` while t >= boundary (high noise), then `transformer_2`; a pipeline of one
        # expert may hold it in either slot
        pipe = self.pipe
        if pipe.transformer is None or (state is not None and state.extra["boundary"] is not None
                                        and t < state.extra["boundary"]):
            return pipe.transformer_2
        return pipe.transformer

    def model_inputs(self, state, latents, t, branch):
        transformer = self.transformer_for(state, t)
        condition, frame_mask = state.extra["condition"], state.extra["frame_mask"]
        if frame_mask is not None:  # TI2V: a timestep per token [B, S], frame-major as the model's tokens
            latents = self._with_first_frame(state, latents)
            _, p_h, p_w = transformer.config.patch_size
            timestep = (frame_mask[0][0][:, ::p_h, ::p_w] * t).flatten().unsqueeze(0).expand(latents.shape[0], -1)
        else:
            if condition is not None:  # image-to-video: [B, z + T + z, F, h, w]
                latents = torch.cat([latents, condition], dim=1)
            timestep = t.expand(latents.shape[0])
        return dict(hidden_states=latents.to(transformer.dtype), timestep=timestep, attention_kwargs=None,
                    **state.branches[branch])

    @staticmethod
    def _with_first_frame(state, latents):
        """TI2V image-to-video: the image's latents in the first frame, the denoised ones after (the pipeline's
        blend by first_frame_mask); text-to-video: the latents as they are."""
        condition, frame_mask = state.extra["condition"], state.extra["frame_mask"]
        return latents if condition is None else (1 - frame_mask) * condition + frame_mask * latents

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        if state.extra["frame_mask"] is not None:
            latents = self._with_first_frame(state, latents)
        latents = latents.to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        return latents / inverse_std + mean  # the pipeline's arithmetic, op for op (bit-equal output)


def _load(image):
    """--image PATH (or an image the Python API passes) as the RGB PIL image the pipeline takes."""
    from diffusers.utils import load_image

    return load_image(image)


RECIPE = WanRecipe
