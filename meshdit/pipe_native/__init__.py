"""Pipe-native meshdit: diffusers' own `pipe(...)` over the mesh (docs/pipelines.md).

    import meshdit
    pipe = FluxPipeline.from_pretrained(...)
    meshdit.parallelize(pipe, meshdit.ParallelConfig(ulysses_degree=2))   # on every rank (torchrun)
    image = pipe("a cat", generator=torch.Generator().manual_seed(0)).images[0]

install.py: parallelize / unparallelize / parallelized; support.py: which classes run and how (read from the
installed diffusers); coverage.py: the generated table.
"""
from .install import installed, parallelize, parallelized, unparallelize

__all__ = ["installed", "is_output_rank", "parallelize", "parallelized", "unparallelize"]


def is_output_rank() -> bool:
    """Global rank 0, or a process alone: the one rank a script should let write files and print."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0
