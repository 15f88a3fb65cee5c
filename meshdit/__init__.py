"""meshdit: run diffusers Diffusion Transformer pipelines over a device mesh.

Scripts (alone, or one process per rank under torchrun):

    import meshdit
    mesh = meshdit.init(meshdit.ParallelConfig(ulysses_degree=2))
    engine = meshdit.Engine.from_pretrained("path/or/hub-id", mesh)
    result = engine.generate(meshdit.GenerateRequest(prompt="...", seed=0))
    meshdit.shutdown()
"""
from .config import GenerateRequest, ParallelConfig
from .errors import ConfigError, RankFailedError
from .lazy import lazy_names

# torch, diffusers and transformers take seconds to import; `meshdit --help` and the checks made before any
# rank starts need none of them, so the names that do are imported on first use.
_LAZY = {"Engine": ".engine", "GenerateResult": ".engine", "ParallelMesh": ".distributed.mesh",
         "plan_layout": ".planner.auto", "parallelize": ".pipe_native", "unparallelize": ".pipe_native",
         "parallelized": ".pipe_native", "CacheSettings": ".cache_settings", "VaeDecodeSettings": ".vae.settings",
         "is_output_rank": ".pipe_native"}

__all__ = ["ConfigError", "Engine", "GenerateRequest", "GenerateResult", "ParallelConfig", "ParallelMesh",
           "RankFailedError", "init", "plan_layout", "shutdown", "parallelize", "unparallelize", "parallelized",
           "CacheSettings", "VaeDecodeSettings", "is_output_rank"]
__version__ = "0.1.0"
__getattr__ = lazy_names(__name__, _LAZY)


def init(config: ParallelConfig, verbose: bool = False) -> "ParallelMesh":
    """Joins the process group (from torchrun's env, or a world of one) and builds the mesh.

    Unless verbose, library warnings stay quiet as in `meshdit generate` (meshdit.logs), and an uncaught
    ConfigError is one line from the output rank instead of a traceback per rank (meshdit.rank_errors)."""
    from .logs import quiet_libraries

    config.validate()
    quiet_libraries(verbose)
    from .rank import join_mesh
    from .rank_errors import report_once

    mesh = join_mesh(config, cpu_threads_from_env=False)
    report_once(mesh.is_output_rank)
    return mesh


def shutdown() -> None:
    """Tears the process group down; call it on every rank before exiting."""
    from .distributed.mesh import teardown_distributed

    teardown_distributed()
