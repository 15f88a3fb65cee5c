"""Peak activation bytes on CPU: the engine's own counter (meshdit/memory.py), shared with the VAE report."""
from meshdit.memory import PeakAllocations

__all__ = ["PeakAllocations"]
