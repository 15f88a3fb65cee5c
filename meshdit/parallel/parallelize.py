"""The one place that combines strategies, in a fixed order."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..distributed.mesh import ParallelMesh
from ..models.registry import ModelFamily
from .pipefusion import PipeFusion
from .sequence import apply_sequence_parallel


@dataclass
class Parallelized:
    """What parallelize() installed: hooks to remove, and the PipeFusion runtime if any."""

    handles: list = field(default_factory=list)
    pipefusion: PipeFusion | None = None
    sequence_state: object = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def parallelize(pipe, family: ModelFamily, mesh: ParallelMesh) -> Parallelized:
    """Applies every strategy the mesh asks for to `pipe`.

    Combinations that cannot run exactly were refused by validation before any
    rank started, so this only applies. CFG and data parallelism need no hooks:
    the denoising loop and the engine split their work.
    """
    done = Parallelized()
    config = mesh.config
    if config.sp_degree > 1 or config.pipefusion_parallel_degree > 1:
        # PipeFusion reuses the sequence hooks to cut the image stream into patches
        states: list = []
        done.handles += apply_sequence_parallel(pipe.transformer, family.plan(), mesh, states)
        done.sequence_state = states[0]
    if config.pipefusion_parallel_degree > 1:
        done.pipefusion = PipeFusion(pipe.transformer, family.pipeline_plan(), mesh, done.sequence_state)
        done.handles += done.pipefusion.handles
    return done
