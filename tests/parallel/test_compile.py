"""--compile: every method's image with compiled blocks equals its eager image (fp32, tiny models).

The 2-rank tests compile with aot_eager (dynamo + AOTAutograd, no code generation: cheap, and it
runs the same graphs with the same graph breaks as inductor), through a backend that counts the
graphs; one serial test compiles with inductor (C++ code generation on CPU, the --compile default).
Tolerance: 1e-5 of the image's largest value, as for every exact method (inductor reorders float
sums; aot_eager is bit-exact here).
"""
import shutil

import pytest

from meshdit.errors import RankFailedError
from tests.parallel import compile_jobs

TOLERANCE = 1e-5
NAME = "flux"  # one double and one single block


@pytest.mark.parametrize("degrees, breaks_per_block", [
    (dict(ulysses_degree=2), 1), (dict(ring_degree=2), 1),
    (dict(pipefusion_parallel_degree=2, warmup_steps=2), 1), (dict(cfg_degree=2), 0),
], ids=["ulysses2", "ring2", "pipefusion2-full-warmup", "cfg2"])
def test_compiled_equals_eager_on_two_ranks(run_ranks, degrees, breaks_per_block):
    for rank, (error, graphs, per_block) in enumerate(run_ranks(2, compile_jobs.compiled_vs_eager, NAME, degrees, 2)):
        assert error <= TOLERANCE, f"rank {rank}: compiled differs from eager by {error:.2e}"
        assert graphs > 0, f"rank {rank}: nothing was compiled"
        # one graph per block, and one more after each attention call the router runs outside the graph
        assert per_block == 1 + breaks_per_block, f"rank {rank}: {per_block} graphs per block call"


def test_pipefusion_one_warmup_step_compiled_equals_eager(run_ranks):
    """Patches of uneven height (5 and 4 token rows) reach the compiled blocks as new shapes."""
    for rank, (error, graphs, _) in enumerate(run_ranks(2, compile_jobs.compiled_vs_eager, NAME,
                                                        dict(pipefusion_parallel_degree=2, warmup_steps=1), 3)):
        assert error <= TOLERANCE and graphs > 0, f"rank {rank}: error {error:.2e}, {graphs} graphs"


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor needs a C++ compiler on CPU")
def test_serial_inductor_equals_eager(run_ranks):
    (error, graphs, per_block), = run_ranks(1, compile_jobs.compiled_vs_eager, NAME, {}, 2, "inductor", timeout=600)
    assert error <= TOLERANCE, f"inductor differs from eager by {error:.2e}"


def test_unknown_backend_is_refused(run_ranks):
    with pytest.raises(RankFailedError, match="is not a torch.compile backend"):
        run_ranks(1, compile_jobs.compiled_vs_eager, NAME, {}, 1, "no-such-backend")


@pytest.mark.parametrize("argv, backend", [([], None), (["--compile"], "inductor"),
                                           (["--use_torch_compile"], "inductor"), (["--compile", "aot_eager"], "aot_eager")])
def test_compile_flag_sets_the_layout(argv, backend):
    from meshdit.cli import build_parser
    from meshdit.flags import layout_from_args

    config, _ = layout_from_args(build_parser().parse_args(["generate", *argv]))
    config.validate()
    assert config.compile == backend
    assert config.describe().endswith(f"compiled ({backend})") == (backend is not None)
