"""FLUX.1 Kontext (FluxKontextPipeline / FluxTransformer2DModel): FLUX.1 that edits a reference image.

The reference image (--image) is VAE-encoded and packed like the latents, and its tokens follow the noise tokens
in the transformer's image sequence, with ids of their own grid whose first coordinate is 1 (the noise's is 0);
the prediction keeps the noise tokens only. Without --image the pipeline draws from text alone, as FLUX.1 does.

The transformer is FLUX.1's, so the plan is FLUX.1's: the reference tokens are part of the image stream. Under
sequence parallelism they are split with it (with their ids): attention runs over every token of every stream
whatever its rank, so the split is exact. Under PipeFusion the last patch's window runs to the stream's end, so
each step computes them once, with the last patch (whole-image warmup steps compute them all: exact).
"""
from __future__ import annotations

import torch
from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS
from diffusers.utils import load_image

from .flux import PLAN, FluxRecipe

__all__ = ["PLAN", "RECIPE"]


class KontextRecipe(FluxRecipe):
    def prepare_latents(self, r, batch, dtype, device, generator):
        pipe = self.pipe
        pixels = None if r.image is None else self.reference_pixels(r.image, r.extra.get("_auto_resize", True))
        # the reference is encoded before the noise is drawn, as in the pipeline (its argmax draws nothing)
        latents, reference, image_ids, reference_ids = pipe.prepare_latents(  # [B, S, 4C], [B, R, 4C], [S, 3], [R, 3]
            pixels, batch, pipe.transformer.config.in_channels // 4, r.height, r.width, dtype, device, generator)
        if reference is None:
            return latents, image_ids, {}
        return latents, torch.cat([image_ids, reference_ids]), dict(reference=reference)  # ids [S + R, 3]

    def reference_pixels(self, image, auto_resize: bool) -> torch.Tensor:
        """The image as FluxKontextPipeline.__call__ prepares it ([1, 3, H', W'] in [-1, 1]): with auto_resize (its
        default) resized to the Kontext training resolution nearest its aspect ratio, else kept at its own size;
        either way cut down to a multiple of 2 x the VAE factor. Written out here: the pipeline does this inside
        __call__, with no method of its own."""
        pipe = self.pipe
        image = load_image(image)  # RGB, EXIF orientation applied
        multiple = pipe.vae_scale_factor * 2
        height, width = pipe.image_processor.get_default_height_width(image)
        if auto_resize:
            aspect = width / height
            _, width, height = min((abs(aspect - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        width, height = width // multiple * multiple, height // multiple * multiple
        image = pipe.image_processor.resize(image, height, width)
        return pipe.image_processor.preprocess(image, height, width)

    def model_inputs(self, state, latents, t, branch):
        inputs = super().model_inputs(state, latents, t, branch)
        if "reference" in state.extra:  # the noise tokens, then the reference's: [B, S + R, 4C]
            inputs["hidden_states"] = torch.cat([latents, state.extra["reference"]], dim=1)
        return inputs

    def postprocess_prediction(self, state, pred):
        return pred[:, :state.latents.shape[1]]  # the noise tokens' prediction


RECIPE = KontextRecipe
