"""Memory-efficient loading: meta skeletons, one shared or streamed copy of the weights, lean ranks."""
from .options import LoadOptions

__all__ = ["LoadOptions"]
