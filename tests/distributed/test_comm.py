"""distributed/comm: every primitive's result and byte count, on a sub-group of a 4-rank pool.

The sub-group holds global ranks 1, 2, 3 (group ranks 0, 1, 2), so a primitive that
named peers by global rank where it means group rank gets the wrong data. The
pipeline channel runs a cycle (every stage sends before it receives), which a
blocking send would deadlock on gloo. Alone (group None) nothing is sent or counted.
"""
import torch
import torch.distributed as dist

from meshdit.distributed.comm import (PipeChannel, RingExchange, all_gather, all_gather_uneven, all_reduce,
                                      all_to_all_chunks, broadcast, broadcast_from, broadcast_object, comm_stats,
                                      exchange_with_neighbours, group_rank, split_sizes)

MEMBERS = [1, 2, 3]
_GROUP: list = []


def _primitives():
    if not _GROUP:  # once per pool process. NOTE: every pool rank joins new_group, members or not
        _GROUP.append(dist.new_group(MEMBERS))
    group = _GROUP[0]
    if dist.get_rank() not in MEMBERS:
        return None
    me, g = dist.get_rank(), group_rank(group)
    comm_stats.reset()
    out = {"g": g}
    out["gather"] = all_gather_uneven(torch.full((2, g + 1), float(me)), 1, [1, 2, 3], group, "t_gather")
    out["sum"] = all_reduce(torch.tensor([float(me)]), group, "t_sum").item()
    out["max"] = all_reduce(torch.tensor([float(me)]), group, "t_max", op="max").item()
    out["bcast"] = broadcast(torch.tensor([float(me)]), 1, group, "t_bcast").item()
    out["object"] = broadcast_object({"from": me}, 2, group, "t_object")
    out["from"] = broadcast_from(torch.arange(3.0) * me if g == 2 else None, 2, group, "t_from", torch.device("cpu"))
    out["halos"] = exchange_with_neighbours(None if g == 0 else torch.full((3,), 10.0 * me),
                                            None if g == 2 else torch.full((3,), 10.0 * me + 1), group, "t_halo")
    send = [torch.full((j + 1,), 100.0 * me + j) for j in range(3)]  # to group rank j: j + 1 values
    out["a2a"] = all_to_all_chunks(send, [(g + 1,)] * 3, group)
    ring = RingExchange(group)
    ring.start(torch.full((2,), float(me)), (2,))
    out["ring"] = ring.wait()
    channel = PipeChannel(group)
    channel.send(torch.full((4,), float(me)), (g + 1) % 3)  # a cycle: 0 -> 1 -> 2 -> 0
    out["pipe"] = channel.recv(torch.empty(4), (g - 1) % 3)
    channel.finish()
    out["counts"] = dict(comm_stats.bytes_sent)
    return out


def test_primitives_on_a_sub_group(run_ranks):
    results = run_ranks(4, _primitives)  # the default timeout: a cold pool starts slowly under load
    assert results[0] is None
    for me in MEMBERS:
        r = results[me]
        g = r["g"]
        assert g == me - 1
        expected = torch.cat([torch.full((2, n), float(rank)) for n, rank in zip([1, 2, 3], MEMBERS)], 1)
        assert torch.equal(r["gather"], expected)
        assert r["sum"] == 6.0 and r["max"] == 3.0
        assert r["bcast"] == 2.0  # group rank 1 is global rank 2
        assert r["object"] == {"from": 3}
        assert torch.equal(r["from"], torch.arange(3.0) * 3)  # only group rank 2 had a tensor
        from_prev, from_next = r["halos"]
        assert (from_prev is None) == (g == 0) and (from_next is None) == (g == 2)
        if from_prev is not None:
            assert torch.equal(from_prev, torch.full((3,), 10.0 * (me - 1) + 1))
        if from_next is not None:
            assert torch.equal(from_next, torch.full((3,), 10.0 * (me + 1)))
        for j, got in enumerate(r["a2a"]):
            assert torch.equal(got, torch.full((g + 1,), 100.0 * MEMBERS[j] + g))
        assert torch.equal(r["ring"], torch.full((2,), float(MEMBERS[(g - 1) % 3])))
        assert torch.equal(r["pipe"], torch.full((4,), float(MEMBERS[(g - 1) % 3])))
        # the counting rules of comm/stats.py, in bytes of float32 (4)
        counts = r["counts"]
        assert counts["t_gather"] == 2 * 3 * 4 * 2  # the part padded to the longest, times 2 peers
        assert counts["t_sum"] == counts["t_max"] == 4 * 2 * 2 // 3
        assert counts.get("t_bcast", 0) == (4 * 2 if g == 1 else 0)
        assert (counts.get("t_object", 0) > 0) == (g == 2)
        assert (counts.get("t_from", 0) > 12 * 2) == (g == 2)  # the values to 2 peers, and the shape before them
        assert counts.get("t_halo", 0) == 12 * ((g > 0) + (g < 2))
        assert counts["all_to_all"] == 4 * (6 - (g + 1))
        assert counts["ring_p2p"] == 8 and counts["pipe_p2p"] == 16


def test_alone_nothing_is_sent_or_counted():
    comm_stats.reset()
    x = torch.arange(6.0).reshape(2, 3)
    assert all_gather(x, None)[0] is x
    assert all_gather_uneven(x, 1, [3], None) is x
    assert torch.equal(all_reduce(x.clone(), None, "t"), x)
    assert torch.equal(broadcast(x.clone(), 0, None, "t"), x)
    assert broadcast_object({"a": 1}, 0, None, "t") == {"a": 1}
    assert all_to_all_chunks([x], [x.shape], None)[0] is x
    assert broadcast_from(x, 0, None, "t", x.device) is x
    assert dict(comm_stats.bytes_sent) == {}
    assert split_sizes(7, 3) == [3, 2, 2]
