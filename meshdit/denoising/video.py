"""What every video family shares: latents [B, C, F, h, w], the token grid over frames, video output.

A video DiT patchifies its latents into an F' x H' x W' grid of tokens, flattened frame-major (Wan,
HunyuanVideo, CogVideoX 1.5, LTX all do; LTX's pipeline packs them itself: latents [B, S, C]). Sequence parallelism splits that flat sequence wherever it falls
(uneven shards; no divisibility asked of frames). PipeFusion cuts it into patches of whole token rows:
the rows of every frame, one after another (F' x H' rows of W' tokens), so a patch may run across a frame
boundary and is still one contiguous run of tokens and one slice of the latents.
"""
from __future__ import annotations

import torch

from .recipe import DenoiseState, Recipe


class VideoRecipe(Recipe):
    """Base of video families' recipes: subclasses fill in prepare_settings / model_inputs / decode_latents."""

    def token_grid(self, state: DenoiseState) -> tuple[int, int]:
        """Token rows of every frame, in order (frames x height), and tokens per row (width).

        The spatial rule is the registry row's (pixel_multiple); token frames are latent frames, which
        assumes a temporal patch of 1 (Wan, HunyuanVideo): else a token row would take latent rows of
        several frames, and no single slice of the latents would hold a patch."""
        rows, cols = super().token_grid(state)  # per frame
        return self.token_frames(state) * rows, cols

    def token_frames(self, state: DenoiseState) -> int:
        """Frames of the token grid: the latents' F ([B, C, F, h, w]); packed latents [B, S, C] (LTX) have no
        frame dim, so their family keeps the count in state.extra["token_frames"]."""
        return state.extra["token_frames"] if state.latents.dim() == 3 else state.latents.shape[2]

    def patch_view(self, state: DenoiseState, latents: torch.Tensor, row0: int, row1: int) -> torch.Tensor:
        """Token rows row0..row1-1 of the F x h rows: a slice of [B, C, F * h, w] (a view of `latents`), or of
        packed [B, S, C] tokens (a run of the sequence: any temporal patch)."""
        if latents.dim() == 3:
            cols = self.token_grid(state)[1]
            return latents[:, row0 * cols:row1 * cols]
        b, c, f, h, w = latents.shape
        rows = f * h // self.token_grid(state)[0]  # latent rows per token row: the patch height
        return latents.view(b, c, f * h, w)[:, :, row0 * rows:row1 * rows]  # view(): raises rather than copy

    def postprocess_prediction(self, state: DenoiseState, pred: torch.Tensor) -> torch.Tensor:
        # the model's unpatchify may leave strides that patch_view's view() cannot take; values unchanged
        return pred.contiguous()

    def postprocess(self, decoded: torch.Tensor, output_type: str):
        """[B, 3, F, H, W] in [-1, 1] -> np [B, F, H, W, 3] in [0, 1] (the pipeline's video processor)."""
        return self.pipe.video_processor.postprocess_video(decoded, output_type=output_type)
