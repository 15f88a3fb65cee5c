"""CogVideoX 1.0 (CogVideoXPipeline / CogVideoXTransformer3DModel): text tokens concatenated before the video
tokens in every block's attention (as in an MMDiT), 3-D rotary embeddings given as an input (5B) or a sin-cos
positional table the patch embedding adds (2B), DDIM (2B) or DPM (5B, draws noise in every step) schedulers.

The pipeline keeps its latents [B, F, C, h, w] (frames before channels); the recipe keeps them [B, C, F, h, w]
like every video family, so PipeFusion's patches of token rows are slices, and hands the model and the
scheduler the pipeline's layout as transposed views: every operation between is elementwise, and the
scheduler's noise is drawn at the pipeline's shape, so the values are the pipeline's.

Image-to-video (CogVideoXImageToVideoPipeline): the image's VAE latents (first frame, zeros after) join the
noisy latents on channels before the model's patch embedding (in_channels doubled), so they are sharded with
the video tokens. An `ofs` embedding (ofs_embed_dim; CogVideoX 1.5 I2V, whose temporal patch meshdit refuses)
is one value for the whole batch. Learned positional embeddings (CogVideoX-5B I2V) are added by the patch
embedding before the split, like the 2B's sin-cos table; they fix the size and the text length (ModelInfo).
"""
from __future__ import annotations

import torch
from diffusers import CogVideoXDPMScheduler
from diffusers.pipelines.cogvideo.pipeline_cogvideox import retrieve_timesteps
from diffusers.utils import load_image

from ..denoising.recipe import COND, UNCOND, DenoiseState
from ..denoising.video import VideoRecipe
from ..parallel.plan import (COLUMN, GATHERED, ROW, BlockList, Gather, ModelPlan, SequencePlan, StagePlan, Split,
                             TensorPlan)

# The patch embedding returns cat(text, video) tokens (positional table added) and the model slices them apart
# before its blocks: both are sharded where the first block takes them, the rotary table (cos, sin), each
# [S, D], where the model takes it (None for the 2B). Each attention sees [text, video], in that order.
PLAN = ModelPlan(
    SequencePlan(
        splits=(
            Split("", "image_rotary_emb", -2, "img"),
            Split("transformer_blocks.0", "hidden_states", -2, "img"),
            Split("transformer_blocks.0", "encoder_hidden_states", -2, "txt"),
        ),
        gathers=(Gather("proj_out", -2, "img"),),
        attention={"transformer_blocks.*.attn1": ("txt", "img")},
    ),
    StagePlan(blocks=(BlockList("transformer_blocks", ("hidden_states", "encoder_hidden_states"),
                                ("hidden_states", "encoder_hidden_states")),)),
    # tensor parallelism (diffusers has no _tp_plan for CogVideoX): attention by heads (its Q/K LayerNorms are
    # per head), the MLP, and the two adaLN modulations [B, 6D] split and gathered
    TensorPlan({
        "transformer_blocks.*.attn1.to_[qkv]": COLUMN,
        "transformer_blocks.*.attn1.to_out.0": ROW,
        "transformer_blocks.*.ff.net.0.proj": COLUMN,
        "transformer_blocks.*.ff.net.2": ROW,
        "transformer_blocks.*.norm[12].linear": GATHERED,
    }),
)


def _frames_first(x: torch.Tensor) -> torch.Tensor:
    """[B, C, F, h, w] <-> [B, F, C, h, w] (a view)."""
    return x.transpose(1, 2)


class CogVideoXRecipe(VideoRecipe):
    batch_branches = True  # uncond and cond in one call, as the pipeline batches them

    def prepare_settings(self, r, generator, device):
        pipe = self.pipe
        cfg = r.guidance_scale > 1
        embeds, n_embeds = pipe.encode_prompt(  # [B, L, D] each
            r.prompts, r.negative_prompt, cfg, num_videos_per_prompt=r.num_images_per_prompt,
            max_sequence_length=r.extra["max_sequence_length"], device=device)
        branches = {COND: dict(encoder_hidden_states=embeds)}
        if cfg:  # uncond first: the order the pipeline batches them in
            branches = {UNCOND: dict(encoder_hidden_states=n_embeds), **branches}
        timesteps, _ = retrieve_timesteps(pipe.scheduler, r.num_inference_steps, device)
        latents, image = self.prepare_latents(r, embeds.shape[0], embeds.dtype, device, generator)
        rotary = None
        if pipe.transformer.config.use_rotary_positional_embeddings:
            # Private: CogVideoXPipeline builds its (cos, sin) [S, D] tables in no public method.
            rotary = pipe._prepare_rotary_positional_embeddings(r.height, r.width, latents.size(1), device)
        pipe.scheduler.meshdit_old_pred = None  # DPM's previous prediction of x0 (see step)
        return DenoiseState(_frames_first(latents).contiguous(), timesteps, branches, r.guidance_scale, r.height,
                            r.width, extra=dict(rotary=rotary, dtype=embeds.dtype, image=image,
                                                step_kwargs=pipe.prepare_extra_step_kwargs(generator, 0.0)))

    def prepare_latents(self, r, batch, dtype, device, generator):
        """(noise [B, F, C, h, w], the image condition: None for text-to-video)."""
        pipe = self.pipe
        return pipe.prepare_latents(batch, pipe.transformer.config.in_channels, r.num_frames, r.height, r.width,
                                    dtype, device, generator), None

    def model_inputs(self, state, latents, t, branch):
        latents = self.pipe.scheduler.scale_model_input(_frames_first(latents), t)  # [B, F, C, h, w]
        if state.extra["image"] is not None:  # image-to-video: [B, F, 2C, h, w]
            latents = torch.cat([latents, state.extra["image"]], dim=2)
        return dict(hidden_states=latents, timestep=t.expand(latents.shape[0]),
                    image_rotary_emb=state.extra["rotary"], attention_kwargs=None, **self.ofs(latents),
                    **state.branches[branch])

    def ofs(self, latents) -> dict:
        """The model's ofs input: none for text-to-video."""
        return {}

    def postprocess_prediction(self, state, pred):
        return _frames_first(pred.float()).contiguous()  # [B, C, F, h, w]

    def step(self, state, noise_pred, t, latents):
        scheduler = self.pipe.scheduler
        video = latents.dim() == 5  # else one PipeFusion patch [B, C, rows, w], stepping alone
        pred, sample = (_frames_first(noise_pred), _frames_first(latents)) if video else (noise_pred, latents)
        if isinstance(scheduler, CogVideoXDPMScheduler):
            # DPM carries its previous x0 prediction across steps; kept on the scheduler in the recipe's layout
            # so PipeFusion's per-patch scheduler copies hold their patch of it
            i = int((state.timesteps == t).nonzero()[0])
            old = scheduler.meshdit_old_pred
            out, old = scheduler.step(pred, None if old is None else (_frames_first(old) if video else old), t,
                                      state.timesteps[i - 1] if i > 0 else None, sample,
                                      **state.extra["step_kwargs"], return_dict=False)
            scheduler.meshdit_old_pred = _frames_first(old) if video else old
        else:
            out = scheduler.step(pred, t, sample, **state.extra["step_kwargs"], return_dict=False)[0]
        out = out.to(state.extra["dtype"])
        return _frames_first(out) if video else out

    def decode_latents(self, state, latents):
        # the pipeline's decode_latents arithmetic (it also decodes, which meshdit.vae does over the ranks)
        return 1 / self.pipe.vae_scaling_factor_image * latents  # [B, C, F, h, w]


class CogVideoXImageToVideoRecipe(CogVideoXRecipe):
    """CogVideoXImageToVideoPipeline: --image's latents (first frame, then zeros) beside the noise's channels."""

    unbatched_keys = ("ofs",)  # [1]: one value for every sample and branch

    def prepare_latents(self, r, batch, dtype, device, generator):
        """(noise [B, F, C, h, w], the image's latents [B, F, C, h, w]: the scaled first frame, zeros after)."""
        pipe = self.pipe
        # one row per video ([B, 3, H, W]): the pipeline takes as many images as videos, encoding (and sampling
        # the latent distribution for) each in turn, so this is the pipeline given the image once per video
        image = pipe.video_processor.preprocess(load_image(r.image), height=r.height, width=r.width).to(
            device, dtype=dtype).repeat(batch, 1, 1, 1)
        return pipe.prepare_latents(image, batch, pipe.transformer.config.in_channels // 2, r.num_frames, r.height,
                                    r.width, dtype, device, generator)

    def ofs(self, latents) -> dict:
        if self.pipe.transformer.config.ofs_embed_dim is None:
            return {}
        return dict(ofs=latents.new_full((1,), fill_value=2.0))  # the pipeline's constant


RECIPE = CogVideoXRecipe
RECIPES = {"CogVideoXImageToVideoPipeline": CogVideoXImageToVideoRecipe}
