"""The shared rank pool: results per rank, failures reported, no hang."""
import pytest
import torch
import torch.distributed as dist

from meshdit.errors import RankFailedError


def _sum_of_ranks():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _raise_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # the other ranks wait on rank 1, which never arrives
    return "unreachable"


def test_pool_runs_on_every_rank(run_ranks):
    assert run_ranks(2, _sum_of_ranks) == [(0, 1.0), (1, 1.0)]


def test_failure_names_rank_and_pool_recovers(run_ranks):
    with pytest.raises(RankFailedError) as info:
        run_ranks(2, _raise_on_rank_one, timeout=60)
    message = str(info.value)
    assert "rank(s) [1]" in message and "boom on purpose" in message
    assert run_ranks(2, _sum_of_ranks) == [(0, 1.0), (1, 1.0)]


def _tensor_and_temp_dir():
    import multiprocessing.util

    # a tensor goes back through the Pipe as a shared-memory file descriptor: multiprocessing makes
    # this process's pymp-* folder for the socket that hands the descriptor over
    return torch.arange(4.0), multiprocessing.util.get_temp_dir()


def test_closed_pool_leaves_no_temp_folders():
    import os

    from meshdit.testing.rank_pool import RankPool

    pool = RankPool(2)
    try:
        results = pool.run(_tensor_and_temp_dir, timeout=120)
        folders = [folder for _, folder in results]
        assert all(t.tolist() == [0.0, 1.0, 2.0, 3.0] for t, _ in results)
        assert all(os.path.isdir(f) for f in folders)
    finally:
        pool.close()
    assert not any(os.path.exists(f) for f in folders), folders  # workers end with os._exit


def _temp_dir_then_fail_on_rank_one(record: str):
    import multiprocessing.util

    with open(f"{record}.{dist.get_rank()}", "w") as f:
        f.write(multiprocessing.util.get_temp_dir())
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # rank 0 waits until the pool kills it


def test_a_failed_job_leaves_no_temp_folders(tmp_path):
    import os

    from meshdit.testing.rank_pool import RankPool

    pool = RankPool(2)
    try:
        with pytest.raises(RankFailedError):
            pool.run(_temp_dir_then_fail_on_rank_one, str(tmp_path / "temp"), timeout=60)
    finally:
        pool.close()
    folders = [(tmp_path / f"temp.{r}").read_text() for r in range(2)]
    assert not any(os.path.exists(f) for f in folders), folders  # rank 0 was killed mid-job
