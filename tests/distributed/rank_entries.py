"""Functions the fault tests run on ranks spawned by meshdit.distributed.launch (importable by spawn)."""
import os
import signal
import time


def _join_world():
    """Joins the gloo world and draws a progress bar, as a generating rank does (tqdm's default
    lock is a multiprocessing semaphore, leaked by a rank that exits mid-run)."""
    import torch
    import torch.distributed as dist
    from tqdm.auto import tqdm

    from meshdit.distributed.mesh import init_distributed

    init_distributed(torch.device("cpu"))
    for _ in tqdm(range(2), desc="denoising"):
        pass
    return torch, dist


def fail_on_rank_1(_):
    """Rank 1 raises; the others wait for it in an all_reduce (and fail or are stopped)."""
    torch, dist = _join_world()
    if dist.get_rank() == 1:
        raise ValueError("injected failure on rank 1")
    dist.all_reduce(torch.ones(1))


def sleep_forever(path):
    """Writes its pid, then sleeps: for SIGTERM/SIGKILL of the launcher."""
    with open(f"{path}.{os.environ['RANK']}", "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.1)


def all_reduce_and_report_port(path):
    """A real collective, then the rendezvous port this world used."""
    torch, dist = _join_world()
    total = torch.ones(1)
    dist.all_reduce(total)
    with open(f"{path}.{dist.get_rank()}", "w") as f:
        f.write(f"{os.environ['MASTER_PORT']} {int(total.item())}")


def freeze_rank_1_at(path):
    """As freeze_rank_1, writing when rank 1 stops (for the time to detection)."""
    torch, dist = _join_world()
    if dist.get_rank() == 1:
        with open(path, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
