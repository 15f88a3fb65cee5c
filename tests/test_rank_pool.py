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
