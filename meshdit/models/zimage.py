"""Z-Image (ZImagePipeline / ZImageTransformer2DModel; Z-Image-Turbo): a single-stream DiT over a list of latents
[C, 1, h, w] and a list of Qwen3 prompt embeddings of each prompt's own length (no text padding: the pipeline keeps
the tokens its attention mask keeps), an SD3-style VAE (AutoencoderKL, scaling and shift factors).

The forward builds its sequences itself (no module returns them): the image tokens, padded to a multiple of 32
(SEQ_MULTI_OF) with a learned pad token, go through `noise_refiner`, the caption tokens (padded alike) through
`context_refiner`, then every sample's [image, caption] is one sequence (samples of different lengths padded and
their padding masked: a [B, N] key mask) for the `layers`, each of which takes the rotary freqs (complex, [B, N, 32])
and the mask whole, then `all_final_layer` and unpatchify (the image tokens' prefix).

Sequence plan: the joint [image, caption] sequence is one split stream ("img": PipeFusion's patches would cut it as
rows of the grid, the caption riding after the grid), split where `layers.0` takes it, its rotary freqs where every
layer takes them (a glob Split: the forward passes the same whole tensor to each), the Omni variant's per-token
noise mask likewise, and gathered at the final layer's output. The two refiners run whole on every rank (2 blocks
each against 30 main layers; their attention is LOCAL: the image refiner's sequence holds no caption, so splitting
it would need the freqs the forward slices after it). A batch whose samples differ in length (prompts padded to
different multiples of 32, e.g. the pipeline's batched [cond, uncond]) brings a key mask: KeyMask attends the local
queries over the gathered K/V under it. diffusers 0.42.1 gives the class no _cp_plan and no _tp_plan.

Guidance is the pipeline's: `cond + g * (cond - uncond)` per sample in float32 (not `uncond + g * (...)`), with
CFG whenever guidance_scale > 0 (Turbo runs at 0), and the prediction negated before the scheduler step.
"""
from __future__ import annotations

import torch
from diffusers.pipelines.z_image.pipeline_z_image import (calculate_shift, get_default_z_image_sigmas,
                                                          retrieve_timesteps)

from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe
from ..parallel.plan import (COLUMN, GATHERED, LOCAL, ROW, BlockList, Gather, KeyMask, ModelPlan, SequencePlan,
                             Split, StagePlan, TensorPlan)

PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("layers.0", "x", -2, "img"),  # [B, N, D]: [image tokens + pad, caption + pad] of every sample
            Split("layers.*", "freqs_cis", -2, "img"),  # [B, N, head_dim / 2] complex, passed whole to each layer
            Split("layers.*", "noise_mask", -1, "img", expected_dims=2),  # Omni: [B, N] noisy / clean tokens
            Split("all_final_layer.*", "noise_mask", -1, "img", expected_dims=2),
        ),
        gathers=(Gather("all_final_layer.2-1", -2, "img"),),
        attention={"layers.*": KeyMask(("img",)), "noise_refiner.*": LOCAL, "context_refiner.*": LOCAL,
                   "siglip_refiner.*": LOCAL},
    ),
    StagePlan(blocks=(BlockList("layers", ("x",), "x"),)),
    # tensor parallelism over the main layers (the refiners stay whole): heads split, SwiGLU's w1 / w3 by columns,
    # w2 and the attention output by rows; the adaLN modulation [B, 4D] gathered
    TensorPlan(styles={
        "layers.*.attention.to_q": COLUMN, "layers.*.attention.to_k": COLUMN, "layers.*.attention.to_v": COLUMN,
        "layers.*.attention.to_out.0": ROW,
        "layers.*.feed_forward.w1": COLUMN, "layers.*.feed_forward.w3": COLUMN, "layers.*.feed_forward.w2": ROW,
        "layers.*.adaLN_modulation.0": GATHERED,
    }),
)


class ZImageRecipe(Recipe):
    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 0  # the pipeline's do_classifier_free_guidance (Turbo: 0, one branch)
        n = r.num_images_per_prompt
        negative = None if r.negative_prompt is None else [r.negative_prompt] * len(r.prompts)
        # copies: the pipeline's _encode_prompt writes the chat-templated prompts into the list it is given
        embeds, negative = pipe.encode_prompt(list(r.prompts), device=device, do_classifier_free_guidance=cfg,
                                              negative_prompt=negative,
                                              max_sequence_length=r.extra["max_sequence_length"])
        branches = {COND: dict(cap_feats=[e for e in embeds for _ in range(n)])}  # each [L_i, cap_feat_dim]
        if cfg:
            branches[UNCOND] = dict(cap_feats=[e for e in negative for _ in range(n)])
        latents = pipe.prepare_latents(len(r.prompts) * n, pipe.transformer.in_channels, r.height, r.width,
                                       torch.float32, device, generator)  # [B, C, h, w]
        cfg_s = pipe.scheduler.config
        mu = calculate_shift((latents.shape[2] // 2) * (latents.shape[3] // 2), cfg_s.get("base_image_seq_len", 256),
                             cfg_s.get("max_image_seq_len", 4096), cfg_s.get("base_shift", 0.5),
                             cfg_s.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device,
                                          sigmas=get_default_z_image_sigmas(r.num_inference_steps), mu=mu)
        pipe.scheduler.set_begin_index(0)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width)

    def model_inputs(self, state, latents, t, branch):
        timestep = (1000 - t.expand(latents.shape[0])) / 1000
        x = list(latents.to(self.pipe.transformer.dtype).unsqueeze(2).unbind(dim=0))  # B x [C, 1, h, w]
        return dict(x=x, t=timestep, **state.branches[branch])

    batch_branches = True  # as the pipeline: [cond, uncond] in one call (their captions' padding then masked)

    def predict(self, state, latents, t, branches):
        if len(branches) < 2:
            return super().predict(state, latents, t, branches)
        # the transformer takes lists, which the base class's batching (tensors along dim 0) does not join
        calls = [self.model_inputs(state, latents, t, b) for b in branches]
        out = self.transformer_for(state, t)(x=sum((c["x"] for c in calls), []), t=torch.cat([c["t"] for c in calls]),
                                             cap_feats=sum((c["cap_feats"] for c in calls), []), return_dict=False)[0]
        n = latents.shape[0]
        return {b: self.postprocess_prediction(state, out[i * n:(i + 1) * n]) for i, b in enumerate(branches)}

    def postprocess_prediction(self, state, pred):
        return torch.stack([p.float() for p in pred], dim=0)  # B x [C, 1, h, w] -> [B, C, 1, h, w], as the pipeline

    def guide(self, state, preds):
        cond = preds[COND]
        if UNCOND in preds:  # the pipeline's formula, sample by sample (elementwise: the same bits batched)
            cond = cond + state.guidance_scale * (cond - preds[UNCOND])
        return -cond.squeeze(2)  # [B, C, h, w]: Z-Image predicts the negated flow

    def slice_batch(self, state, start, stop):
        # the caption features are a list (one tensor per sample), which the base class's cut leaves whole
        sliced = super().slice_batch(state, start, stop)
        sliced.branches = {b: dict(cap_feats=v["cap_feats"][start:stop]) for b, v in state.branches.items()}
        return sliced

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor


RECIPE = ZImageRecipe
