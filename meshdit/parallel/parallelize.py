"""The one place that combines strategies, in a fixed order."""
from __future__ import annotations

from ..distributed.mesh import ParallelMesh
from ..models.registry import ModelFamily
from .sequence import apply_sequence_parallel


def parallelize(pipe, family: ModelFamily, mesh: ParallelMesh) -> list:
    """Applies every strategy the mesh asks for to `pipe`; returns hook handles.

    Combinations that cannot run exactly were refused by validation before any
    rank started, so this only applies.
    """
    handles = []
    if mesh.config.sp_degree > 1:
        handles += apply_sequence_parallel(pipe.transformer, family.plan(), mesh)
    return handles
