"""Every message between ranks: the primitives, the byte counters and where a wire codec applies.

meshdit's data plane (activations, K/V, latents, images, GroupNorm statistics, weights
streamed at load) calls torch.distributed only through this package:

- collectives.py: uneven all-to-all (Ulysses), uneven and equal all-gathers (sequence
  gathers, CFG's branch exchange, data-parallel images), all-reduce (VAE statistics and
  tiles, the agreed stop flag; tensor parallelism's row-parallel sums), broadcasts (PipeFusion's final latents, streamed weights,
  text embeddings, images decoded on one rank of the image group);
  small objects gathered once at setup (PipeFusion's stage cut, compared across stages);
- point_to_point.py: the ring exchange (ring attention), the pipeline channel between
  PipeFusion stages, the neighbour exchange (VAE halos), plain send/recv (weight streaming);
- stats.py: the byte counters, incremented only here, one rule per primitive;
- the spans of ../timeline.py (benchmarks.timeline) are recorded around the waits here too.

Groups: a `group` of None means this process alone; every primitive sends nothing,
and counts nothing, on a group of one rank. Peers and sources are group ranks.

Wire codec: a caller passes `codec` (or PipeChannel's `codec_for`); only here is it
applied (meshdit.quant.codec's FP8 codec: Ulysses' all-to-all, the ring's K/V, the
pipeline's stage traffic); what travels and is counted is its bytes.

The gloo rules (benchmarks/gloo_p2p.py; its timings are in docs/figures.md, "gloo point to point"):
- a blocking `send` returns only once the peer has posted the matching receive;
- `isend` returns at once but its work is not completed until the peer posts the receive:
  wait() returns only then. Nothing is buffered eagerly, whatever the message size;
- so a cycle of blocking sends (every rank sends before it receives) deadlocks, until the
  group's timeout. Hence: ring and halo sends are posted together with their receives
  (batch_isend_irecv), pipeline sends are isends waited for at the end (the last stage's
  hand-back to stage 0 closes a cycle), and a blocking send is used only towards a rank
  already waiting in its receive (weight streaming).
NCCL may also hold a send until its peer receives (large messages), so the same rules serve it.
"""
from .collectives import (PendingAllToAll, all_gather, all_gather_object, all_gather_uneven, all_reduce,
                          all_to_all_chunks, all_to_all_flat_async, broadcast, broadcast_from, broadcast_object,
                          group_rank, group_size, split_sizes, tensor_parallel_all_reduce)
from .point_to_point import PipeChannel, RingExchange, exchange_with_neighbours, recv_into, send
from .stats import CommStats, comm_stats

__all__ = [
    "CommStats", "PendingAllToAll", "PipeChannel", "RingExchange", "all_gather", "all_gather_object",
    "all_gather_uneven", "all_reduce",
    "all_to_all_chunks", "all_to_all_flat_async", "broadcast", "broadcast_from",
    "broadcast_object", "comm_stats",
    "exchange_with_neighbours", "group_rank", "group_size", "recv_into", "send", "split_sizes",
    "tensor_parallel_all_reduce",
]
