"""Run by torchrun in tests/distributed/test_two_nodes.py: each rank writes the ranks lean loading groups it with
(loading.transport.host_groups: one reader per host, the lowest rank of the group)."""
import json
import os
import sys

import torch.distributed as dist

from meshdit.loading.transport import host_groups

if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        members, _ = host_groups()
        with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump({"host": os.environ.get("MESHDIT_HOST_ID"), "members": members}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
