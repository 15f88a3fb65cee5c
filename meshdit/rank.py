"""The one rank bootstrap of `meshdit generate`, `meshdit serve` and torchrun scripts: join the world, set the
CPU threads, build the mesh, build the engine from its EngineSettings."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from .engine_settings import EngineSettings
from .logs import quiet_libraries


@dataclass
class RankEngine:
    engine: object  # meshdit.engine.Engine
    mesh: object  # meshdit.distributed.mesh.ParallelMesh
    load_seconds: float


def start_rank(settings: EngineSettings, on_mesh: Callable[[object], None] | None = None) -> RankEngine:
    """Run on every rank. `on_mesh(mesh)` runs once the mesh exists and before the weights load (serve: the
    output rank starts answering HTTP while the model loads)."""
    quiet_libraries(settings.verbose)  # before torch, diffusers and transformers are imported
    import torch

    from .distributed.mesh import ParallelMesh, init_distributed
    from .engine import Engine

    device = init_distributed()
    if device.type == "cpu":
        # One thread per rank unless OMP_NUM_THREADS says otherwise: small models run fastest so, and
        # several threads per rank on a busy machine oversubscribe its cores (measured 1.4 s vs 45 s
        # for the default model with 2 threads while another process held one of 2 cores).
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    mesh = ParallelMesh.build(settings.config, device)
    if on_mesh is not None:
        on_mesh(mesh)
    start = time.perf_counter()
    engine = Engine.from_settings(settings, mesh)
    return RankEngine(engine, mesh, time.perf_counter() - start)
