"""LTX-Video (LTXPipeline / LTXVideoTransformer3DModel): text-to-video, self-attention over packed video tokens
with 3-D rotary embeddings from the token coordinates, cross-attention to T5 text (with its padding mask).

The pipeline packs the latents itself into [B, S, C] tokens, frame-major (F' x H' x W', as Flux packs an
image's), so the model takes the token sequence as its input and the grid's size as plain ints. Its rotary
positions are scaled by the frame rate (rope_interpolation_scale), so the request's fps conditions the video.
A timestep-conditioned VAE (LTX 0.9.1+) decodes at a timestep, from latents mixed with fresh noise: the
pipeline's decode_timestep and decode_noise_scale, request extras here (Python API: extra={"decode_timestep":
0.05, "decode_noise_scale": 0.025}, LTX 0.9.1's recommended values; default 0 and None, the pipeline's).

Image-to-video (LTXImageToVideoPipeline): the image's VAE latents replace the first latent frame, and its
conditioning mask [B, S] (1 on those tokens) makes their timestep 0: the model takes a per-token timestep
[B, S], which sequence parallelism and PipeFusion's patches cut with the video tokens (the plan's `timestep`
split); text-to-video passes [B, 1], a table every rank keeps whole. The pipeline steps only the other frames;
here the guided velocity is 0 on the mask, so flow-match Euler's x + dt * v leaves those tokens exactly as they
are, patch by patch too.

LTXConditionPipeline takes --image as its one condition, at frame 0 with strength 1 (LTXConditionRecipe: the same
first-frame tokens, re-noised every step, per-token timesteps in the scheduler step too); other conditions are
refused before ranks start (the registry row's refused_call_arguments says why).
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps
from diffusers.utils import load_image
from diffusers.utils.torch_utils import randn_tensor

from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe
from ..parallel.plan import LOCAL, OUTPUT, BlockList, Gather, ModelPlan, SequencePlan, StagePlan, Split

# The tokens are sharded where the model takes them, the rotary table (cos, sin), each [B, S, D], where the
# rope module returns it (the rope builds the whole grid from the ints, so it needs no split input), as
# diffusers' _cp_plan does. Text stays whole on every rank (attn2 is cross-attention: LOCAL), so its tokens
# and padding mask are not split, unlike the _cp_plan's (tests/models/test_diffusers_guard.py: NOT_SPLIT).
# The timestep is per token [B, S] in image-to-video, split with the tokens; [B, 1] in text-to-video (a table);
# [B] (diffusers' own transformer test) has no tokens and stays whole, as Wan's does (expected_dims).
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("", "hidden_states", -2, "img"),
            Split("", "timestep", -1, "img", table=True, expected_dims=2),
            # LTXI2VLongMultiPromptPipeline's per-token timestep is [B, S, 1]
            Split("", "timestep", -2, "img", table=True, expected_dims=3),
            Split("rope", OUTPUT, -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "transformer_blocks.*.attn1": ("img",),
            "transformer_blocks.*.attn2": LOCAL,
        },
    ),
    StagePlan(blocks=(BlockList("transformer_blocks", ("hidden_states",), "hidden_states"),)),
)


class LTXRecipe(VideoRecipe):
    batch_branches = True  # uncond and cond in one call, as the pipeline batches them

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        embeds, mask, n_embeds, n_mask = pipe.encode_prompt(  # [B, L, D], [B, L] each
            prompt=r.prompts, negative_prompt=r.negative_prompt, do_classifier_free_guidance=cfg,
            num_videos_per_prompt=r.num_images_per_prompt, max_sequence_length=r.extra["max_sequence_length"],
            device=device)
        branches = {COND: dict(encoder_hidden_states=embeds, encoder_attention_mask=mask)}
        if cfg:  # uncond first: the order the pipeline batches them in
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, encoder_attention_mask=n_mask), **branches}
        batch = embeds.shape[0]
        latents, condition = self.prepare_latents(r, batch, embeds.dtype, device, generator)
        temporal, spatial = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
        grid = dict(num_frames=(r.num_frames - 1) // temporal + 1, height=r.height // spatial,
                    width=r.width // spatial)  # latent frames, rows, columns
        timesteps = self.schedule(r, grid, device)
        # the condition's state, with what the pipeline's loop draws for it, drawn before the decode noise
        loop = self.prepare_condition(latents, condition, timesteps, generator)
        decode = None
        if pipe.vae.config.timestep_conditioning:
            # the pipeline draws the decode noise from the same generator right after the denoising loop, which
            # draws nothing (flow-match Euler): drawn here, it is the same noise, and every rank holds it
            shape = (batch, pipe.vae.config.latent_channels, grid["num_frames"], grid["height"], grid["width"])
            timestep = float(r.extra.get("decode_timestep", 0.0))
            scale = r.extra.get("decode_noise_scale")  # None: the timestep, as in the pipeline
            decode = dict(noise=randn_tensor(shape, generator=generator, device=device, dtype=embeds.dtype),
                          timestep=torch.full((batch,), timestep, device=device, dtype=embeds.dtype),  # [B]
                          scale=torch.full((batch,), timestep if scale is None else float(scale), device=device,
                                           dtype=embeds.dtype))  # [B]
        grid["rope_interpolation_scale"] = (temporal / r.fps, spatial, spatial)  # the pipeline's frame_rate = fps
        patch_t = pipe.transformer_temporal_patch_size
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width,
                            extra=dict(grid=grid, token_frames=grid["num_frames"] // patch_t, decode=decode,
                                       dtype=embeds.dtype, condition=condition, **loop))

    def prepare_latents(self, r, batch, dtype, device, generator):
        """([B, S, C] packed noise tokens, fp32 as the pipeline keeps them; no conditioning mask)."""
        pipe = self.pipe
        return pipe.prepare_latents(batch, pipe.transformer.config.in_channels, r.height, r.width, r.num_frames,
                                    torch.float32, device, generator), None

    def schedule(self, r, grid, device) -> torch.Tensor:
        """The timesteps: LTXPipeline's sigmas, shifted by the token count."""
        pipe = self.pipe
        cfg_s = pipe.scheduler.config
        mu = calculate_shift(grid["num_frames"] * grid["height"] * grid["width"], cfg_s.get("base_image_seq_len", 256),
                             cfg_s.get("max_image_seq_len", 4096), cfg_s.get("base_shift", 0.5),
                             cfg_s.get("max_shift", 1.15))
        steps = r.num_inference_steps
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 1 / steps, steps),
                                          mu=mu)
        pipe.scheduler.set_begin_index(0)
        return timesteps

    def prepare_condition(self, latents, condition, timesteps, generator) -> dict:
        """state.extra entries a condition adds, with any noise the pipeline's loop draws for it, drawn here in
        the loop's order (flow-match Euler's own steps draw none)."""
        return {}

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents.to(state.extra["dtype"]), timestep=self.timestep(state, t, latents),
                    attention_kwargs=None, **self.positions(state), **state.branches[branch])

    def timestep(self, state, t, latents) -> torch.Tensor:
        """[B, 1]: the model flattens it, as the pipeline's [B]."""
        return t.expand(latents.shape[0])[:, None]

    def positions(self, state) -> dict:
        """The rotary positions: the grid's size and the frame rate's scale."""
        return state.extra["grid"]

    def postprocess_prediction(self, state, pred):
        return pred.float()

    def decode_latents(self, state, latents):
        pipe = self.pipe
        grid = state.extra["grid"]
        # Private static methods: LTXPipeline has no public one that unpacks [B, S, C] tokens into
        # [B, C, F, h, w] or undoes the VAE's latent normalization.
        latents = pipe._unpack_latents(latents, grid["num_frames"], grid["height"], grid["width"],
                                       pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size)
        latents = pipe._denormalize_latents(latents, pipe.vae.latents_mean, pipe.vae.latents_std,
                                            pipe.vae.config.scaling_factor).to(state.extra["dtype"])
        decode = state.extra["decode"]
        if decode is not None:  # the pipeline's mix of latents and noise
            scale = decode["scale"][:, None, None, None, None]
            latents = (1 - scale) * latents + scale * decode["noise"]
        return latents.to(pipe.vae.dtype)

    def vae_decode_kwargs(self, state):
        decode = state.extra["decode"]
        return {} if decode is None else dict(temb=decode["timestep"])


class LTXImageToVideoRecipe(LTXRecipe):
    """LTXImageToVideoPipeline: --image's latents in place of the first latent frame."""

    def timestep(self, state, t, latents):
        return super().timestep(state, t, latents) * (1 - state.extra["condition"])  # [B, S]: 0 on the image

    def guide(self, state, preds):
        # the pipeline steps the frames after the conditioning ones only: a velocity of 0 keeps them exactly
        pred = super().guide(state, preds)
        return torch.where(state.extra["condition"][..., None].bool(), torch.zeros_like(pred), pred)

    def prepare_latents(self, r, batch, dtype, device, generator):
        """([B, S, C] tokens: the image's normalized latents on the first frame, noise after; [B, S] mask)."""
        pipe = self.pipe
        image = pipe.video_processor.preprocess(load_image(r.image), height=r.height, width=r.width).to(
            device=device, dtype=dtype)  # [1, 3, H, W]
        return pipe.prepare_latents(image, batch, pipe.transformer.config.in_channels, r.height, r.width,
                                    r.num_frames, torch.float32, device, generator)


IMAGE_COND_NOISE_SCALE = 0.15
"""LTXConditionPipeline's default image_cond_noise_scale (meshdit passes no other)."""


class LTXConditionRecipe(LTXRecipe):
    """LTXConditionPipeline with one condition: --image at frame 0, strength 1 (the pipeline's image=, frame_index=0,
    strength=1.0): its latents replace the first latent frame, as in image-to-video, but every step first re-noises
    those tokens (init + 0.15 x noise x t^2, noise drawn from the generator each step: drawn here in order), the
    model takes min(t, (1 - mask) x 1000) per token and the frame-rate-scaled `video_coords`, and the scheduler
    steps with those per-token timesteps, keeping the conditioning tokens.

    The step works per token, so a PipeFusion patch must know its tokens: the scheduler holds `meshdit_tokens`,
    each token's index at the latents' shape, which PipeFusion's per-patch scheduler copies cut to their patch."""

    unbatched_keys = ("noised_tokens",)

    def prepare_latents(self, r, batch, dtype, device, generator):
        """([B, S, C] tokens, the image's on the first frame; [B, S] conditioning mask; [B, 3, S] coordinates)."""
        pipe = self.pipe
        image = pipe.video_processor.preprocess(load_image(r.image), r.height, r.width).unsqueeze(2).to(
            device, dtype=pipe.vae.dtype)  # [1, 3, 1, H, W]
        latents, mask, coords, _ = pipe.prepare_latents(
            [image], [1.0], [0], batch_size=batch, num_channels_latents=pipe.transformer.config.in_channels,
            height=r.height, width=r.width, num_frames=r.num_frames, generator=generator, device=device,
            dtype=torch.float32)
        coords = coords.float()
        coords[:, 0] = coords[:, 0] * (1.0 / r.fps)  # the pipeline's frame_rate
        self._video_coords = coords  # [B, 3, S]: the rotary positions, taken into the state by prepare_condition
        return latents, mask

    def schedule(self, r, grid, device):
        # Module function of the pipeline's file, not exported: its default sigma schedule.
        from diffusers.pipelines.ltx.pipeline_ltx_condition import linear_quadratic_schedule

        timesteps, _ = retrieve_timesteps(self.pipe.scheduler, r.num_inference_steps, device,
                                          linear_quadratic_schedule(r.num_inference_steps) * 1000)
        return timesteps

    def prepare_condition(self, latents, condition, timesteps, generator):
        """The coordinates, each step's re-noised conditioning tokens ([B, steps, n, C], n: the tokens whose mask
        is 1; the first step's applied to the starting latents) and their indices."""
        pipe = self.pipe
        init = latents.clone()
        noised = []
        for t in timesteps:  # the pipeline's add_noise_to_image_conditioning_latents, one draw per step
            noise = randn_tensor(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
            noised.append(init + IMAGE_COND_NOISE_SCALE * noise * ((t / 1000.0) ** 2))
        need = (condition[0] > 1.0 - 1e-6).nonzero()[:, 0]  # [n]: every video has the same condition
        noised = torch.stack([n[:, need] for n in noised], dim=1)  # [B, steps, n, C]
        latents[:, need] = noised[:, 0]
        pipe.scheduler.meshdit_tokens = _token_index(latents)
        return dict(coords=self._video_coords, noised=noised, noised_tokens=need)

    def slice_batch(self, state, start, stop):
        state = super().slice_batch(state, start, stop)
        self.pipe.scheduler.meshdit_tokens = _token_index(state.latents)  # at this rank's batch
        return state

    def timestep(self, state, t, latents):
        return self._token_timestep(t, state.extra["condition"])

    @staticmethod
    def _token_timestep(t, mask):
        """[B, s]: t, or less where a condition's strength holds the token back (0 at strength 1)."""
        return torch.min(t.expand(mask.shape[0]).unsqueeze(-1).float(), (1 - mask) * 1000.0)

    def positions(self, state):
        return dict(video_coords=state.extra["coords"])

    def step(self, state, noise_pred, t, latents):
        scheduler = self.pipe.scheduler
        tokens = scheduler.meshdit_tokens[0, :, 0].long()  # [s]: the tokens of these latents (a patch's, or all)
        mask = state.extra["condition"][:, tokens]  # [B, s]
        stepped = scheduler.step(-noise_pred, t, latents, per_token_timesteps=self._token_timestep(t, mask),
                                 return_dict=False)[0]
        out = torch.where((t / 1000 - 1e-6 < (1.0 - mask)).unsqueeze(-1), stepped, latents)
        i = int((state.timesteps == t).nonzero()[0])
        if i + 1 < len(state.timesteps):  # the next step's re-noised conditioning tokens, where they lie here
            need = state.extra["noised_tokens"]
            here = (need >= tokens[0]) & (need <= tokens[-1])
            out[:, need[here] - tokens[0]] = state.extra["noised"][:, i + 1, here]
        return out


def _token_index(latents: torch.Tensor) -> torch.Tensor:
    """[B, S, C] (a broadcast view): each token's index, at the latents' shape, so PipeFusion's per-patch
    scheduler copies (which cut latent-shaped tensors to their patch) hold their tokens' indices."""
    return torch.arange(latents.shape[1], dtype=torch.float32, device=latents.device)[None, :, None].expand(
        latents.shape)


RECIPE = LTXRecipe
RECIPES = {"LTXImageToVideoPipeline": LTXImageToVideoRecipe, "LTXConditionPipeline": LTXConditionRecipe}
