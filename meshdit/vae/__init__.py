"""Parallel and tiled VAE decode over the mesh (patch-parallel row bands: exact; tiles: approximate).

    settings = VaeDecodeSettings(parallel=True, tile_height=None, tile_width=None, tile_overlap=64)
    settings.validate()                      # ConfigError naming the fix
    image = decode(vae, latents, settings, group)   # every rank of the group calls it; all get the image
    peak_memory_report()                     # activation peak of the last decode on this rank
"""
from .decode import decode, upsampling_factor
from .memory import peak_memory_report, set_memory_method
from .settings import VaeDecodeSettings

__all__ = ["VaeDecodeSettings", "decode", "peak_memory_report", "set_memory_method", "upsampling_factor"]
