"""Lean loading under tensor parallelism: each tp rank materialises only its shards of the blocks' weights."""
import numpy as np

from tests.parallel import tensor_jobs

# a column-parallel, a row-parallel and a gathered (modulation) weight of FLUX.1
SHAPES_OF = ("transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_out.0.weight",
             "transformer_blocks.0.norm1.linear.weight", "single_transformer_blocks.0.proj_out.weight")


def test_each_tp_rank_loads_only_its_shards(run_ranks, flux_folder):
    serial_bytes, serial_blocks, serial_shapes, serial_image = tensor_jobs.lean_load(flux_folder, {}, SHAPES_OF)
    results = run_ranks(2, tensor_jobs.lean_load, flux_folder, dict(tensor_parallel_degree=2), SHAPES_OF)
    for rank, (loaded, blocks, shapes, image) in enumerate(results):
        assert loaded <= 0.55 * serial_bytes, f"rank {rank}: {loaded} of {serial_bytes} parameter bytes after loading"
        for i, (held, whole) in enumerate(zip(blocks, serial_blocks)):
            assert held < whole, f"rank {rank} holds all of block {i}"
        for name, shape in shapes.items():
            assert np.prod(shape) < np.prod(serial_shapes[name]), f"rank {rank}: {name} is whole {shape}"
        tol = 1e-5 * float(np.abs(serial_image).max())
        assert float(np.abs(image - serial_image).max()) <= tol, f"rank {rank}: image differs"


def test_lean_loading_under_tp2_x_pipefusion2(run_ranks, flux_folder):
    """Each rank loads its stage's blocks, cut to its tp shards; all warm steps: serial's image."""
    serial_image = tensor_jobs.lean_load(flux_folder, {}, ())[3]
    layout = dict(tensor_parallel_degree=2, pipefusion_parallel_degree=2, warmup_steps=2)
    for rank, (_, blocks, _, image) in enumerate(run_ranks(4, tensor_jobs.lean_load, flux_folder, layout, ())):
        assert sum(b > 0 for b in blocks) == 2, f"rank {rank} holds blocks {blocks}"  # its stage's 2 of 4
        tol = 1e-5 * float(np.abs(serial_image).max())
        assert float(np.abs(image - serial_image).max()) <= tol, f"rank {rank}: image differs"
