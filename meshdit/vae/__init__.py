"""Parallel and tiled VAE decode over the mesh (patch-parallel row bands: exact; tiles: approximate).

    settings = VaeDecodeSettings(parallel=True, tile_height=None, tile_width=None, tile_overlap=64)
    settings.validate()                      # ConfigError naming the fix
    image = decode(vae, latents, settings, group)   # every rank of the group calls it; all get the image
    if decodes_here(settings, group): ...   # without parallel decode only the group's rank 0 needs a VAE
    image = share_images(image, settings, group, device)  # ... and sends the images to the others
    peak_memory_report()                     # activation peak of the last decode on this rank
"""
from ..lazy import lazy_names
from .settings import VaeDecodeSettings

# decode needs torch and diffusers; the settings (checked before any rank starts) need neither.
_LAZY = {"decode": ".decoding", "decodes_here": ".decoding", "share_images": ".decoding", "upsampling_factor": ".decoding", "peak_memory_report": ".memory",
         "set_memory_method": ".memory"}
__all__ = ["VaeDecodeSettings", "decode", "decodes_here", "share_images", "peak_memory_report", "set_memory_method", "upsampling_factor"]
__getattr__ = lazy_names(__name__, _LAZY)
