"""Stable Diffusion 3 / 3.5 (StableDiffusion3Pipeline / SD3Transformer2DModel): joint attention, plus
image-only attn2 in SD3.5's dual-attention blocks."""
from __future__ import annotations

from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift, retrieve_timesteps

from ..parallel.plan import (COLUMN, GATHERED, OUTPUT, ROW, BlockList, Gather, ModelPlan, StagePlan, SequencePlan,
                             Split, TensorPlan)
from ..denoising.recipe import COND, UNCOND, DenoiseState, Recipe

# The latent is patchified inside forward, so tokens are sharded at the outputs of the patch
# embedding (which adds the positional embedding) and the text projection, and gathered before
# the model unpatchifies.
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("pos_embed", OUTPUT, -2, "img"),
            Split("context_embedder", OUTPUT, -2, "txt"),
            # a ControlNet's per-block residuals [B, S_img, D] (the ControlNet runs whole on every rank), added to
            # the image tokens in the block loop: split like them
            Split("", "block_controlnet_hidden_states", -2, "img"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={
            "transformer_blocks.*.attn2": ("img",),
            "transformer_blocks.*.attn": ("img", "txt"),
        },
    ),
    StagePlan(blocks=(
        BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                  ("encoder_hidden_states", "hidden_states")),
    )),
    # tensor parallelism (diffusers has no _tp_plan for SD3): joint attention (and SD3.5's second, image-only
    # attention) by heads, both streams' MLPs, the adaLN modulations split and gathered
    TensorPlan({
        "transformer_blocks.*.attn*.to_[qkv]": COLUMN,
        "transformer_blocks.*.attn.add_[qkv]_proj": COLUMN,
        "transformer_blocks.*.attn*.to_out.0": ROW,
        "transformer_blocks.*.attn.to_add_out": ROW,
        "transformer_blocks.*.ff*.net.0.proj": COLUMN,
        "transformer_blocks.*.ff*.net.2": ROW,
        "transformer_blocks.*.norm1*.linear": GATHERED,
    }),
)


SKIP_LAYERS = "skip_layers"
"""Skip-layer guidance's third branch: the conditional pass with `skip_guidance_layers` left out."""
# StableDiffusion3Pipeline.__call__'s defaults
SKIP_LAYER_DEFAULTS = dict(skip_layer_guidance_scale=2.8, skip_layer_guidance_start=0.01, skip_layer_guidance_stop=0.2)


class SD3Recipe(Recipe):
    batch_branches = True
    solo_branches = (SKIP_LAYERS,)  # diffusers runs it as a call of its own, after the batched uncond and cond

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        embeds, n_embeds, pooled, n_pooled = pipe.encode_prompt(
            prompt=r.prompts, prompt_2=None, prompt_3=None, device=device,
            num_images_per_prompt=r.num_images_per_prompt, do_classifier_free_guidance=cfg,
            negative_prompt=r.negative_prompt, max_sequence_length=r.extra["max_sequence_length"])
        branches = {COND: dict(encoder_hidden_states=embeds, pooled_projections=pooled)}
        if cfg:  # uncond first: the order diffusers batches them in
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds, pooled_projections=n_pooled), **branches}
        extra = {}
        layers = r.extra.get("skip_guidance_layers")
        if cfg and layers:  # skip-layer guidance (the pipeline applies it only with CFG)
            slg = {key: r.extra.get(key, default) for key, default in SKIP_LAYER_DEFAULTS.items()}
            steps = r.num_inference_steps  # the pipeline's window: start * steps < i < stop * steps
            extra = dict(skip_layer_scale=slg["skip_layer_guidance_scale"], skip_layer_steps=tuple(
                i for i in range(steps) if steps * slg["skip_layer_guidance_start"] < i
                < steps * slg["skip_layer_guidance_stop"]))
            branches[SKIP_LAYERS] = dict(**branches[COND], skip_layers=list(layers))
        latents = pipe.prepare_latents(embeds.shape[0], pipe.transformer.config.in_channels, r.height, r.width,
                                       embeds.dtype, device, generator)  # [B, C, h, w]
        kwargs = {}
        sc = pipe.scheduler.config
        if sc.get("use_dynamic_shifting", None):
            patch = pipe.transformer.config.patch_size
            seq = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            kwargs["mu"] = calculate_shift(seq, sc.get("base_image_seq_len", 256), sc.get("max_image_seq_len", 4096),
                                           sc.get("base_shift", 0.5), sc.get("max_shift", 1.16))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device, **kwargs)
        return DenoiseState(latents, timesteps, branches, r.guidance_scale, r.height, r.width, extra)

    def step_branches(self, state, step):
        if step in state.extra.get("skip_layer_steps", ()):
            return state.branch_names
        return [b for b in state.branch_names if b != SKIP_LAYERS]

    def guide(self, state, preds):
        noise_pred = super().guide(state, preds)
        if SKIP_LAYERS in preds:  # the pipeline's arithmetic, in its order
            noise_pred = noise_pred + (preds[COND] - preds[SKIP_LAYERS]) * state.extra["skip_layer_scale"]
        return noise_pred

    def model_inputs(self, state, latents, t, branch):
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]), joint_attention_kwargs=None,
                    **state.branches[branch])

    def decode_latents(self, state, latents):
        vae = self.pipe.vae
        return latents / vae.config.scaling_factor + vae.config.shift_factor


RECIPE = SD3Recipe
