"""The one rank bootstrap of `meshdit generate` and `meshdit serve` (start_rank: join the world, CPU threads,
the mesh, the engine from its EngineSettings); `meshdit.init` (torchrun scripts) joins through join_mesh too."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

from .engine_settings import EngineSettings
from .logs import quiet_libraries
from .phases import reached


@dataclass
class RankEngine:
    engine: object  # meshdit.engine.Engine
    mesh: object  # meshdit.distributed.mesh.ParallelMesh
    load_seconds: float


def join_mesh(config, cpu_threads_from_env: bool = True):
    """Joins the process group (torchrun's or the launcher's env; a world of one without) and builds the
    ParallelMesh of `config`. cpu_threads_from_env: on CPU, OMP_NUM_THREADS threads (default 1) for this rank;
    meshdit.init (the Python API) leaves torch's own choice."""
    import torch

    from .distributed.mesh import ParallelMesh, init_distributed

    device = init_distributed()
    if device.type == "cpu" and cpu_threads_from_env:
        # One thread per rank unless OMP_NUM_THREADS says otherwise: small models run fastest so, and
        # several threads per rank on a busy machine oversubscribe its cores (docs/install.md, "Devices,
        # dtypes and threads").
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    return ParallelMesh.build(config, device)


def start_rank(settings: EngineSettings, on_mesh: Callable[[object], None] | None = None) -> RankEngine:
    """Run on every rank. `on_mesh(mesh)` runs once the mesh exists and before the weights load (serve: the
    output rank starts answering HTTP while the model loads)."""
    quiet_libraries(settings.verbose)  # before torch, diffusers and transformers are imported
    from .engine import Engine

    mesh = join_mesh(settings.config)
    if on_mesh is not None:
        on_mesh(mesh)
    reached("loading")
    start = time.perf_counter()
    engine = Engine.from_settings(settings, mesh)
    load_seconds = time.perf_counter() - start
    if settings.config.compile and mesh.is_output_rank:  # else the bar sits at step 0 while the blocks compile
        from .parallel.compile import compiling_notice

        print(compiling_notice(settings.config.compile), file=sys.stderr, flush=True)
    return RankEngine(engine, mesh, load_seconds)
