"""One named DeviceMesh per process, built once; strategies ask for axes by name."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..config import ParallelConfig
from ..mesh_axes import DERIVED_GROUPS, MESH_AXES, MeshAxis
from .ports import free_port
from .watch import joined_world

# Long enough for a slow first step on a loaded CPU, short enough that a lost
# peer turns into an error rather than an endless wait.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("MESHDIT_COLLECTIVE_TIMEOUT", "300")))


def pick_device() -> torch.device:
    """cuda:<local rank> where a CUDA/ROCm device is visible, else cpu."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(device: torch.device | None = None) -> torch.device:
    """Joins the process group described by the env (RANK, WORLD_SIZE, MASTER_*).

    gloo on CPU, NCCL on CUDA (RCCL on ROCm, same backend name). A world of one
    process without the env variables still gets a group, so code paths are the same.
    """
    device = device or pick_device()
    if dist.is_initialized():
        return device
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=DEFAULT_TIMEOUT)
    joined_world()  # the launcher's heartbeat watch: start-up is over
    return device


def teardown_distributed() -> None:
    """Explicit teardown: gloo processes that exit without it often abort (DESIGN.md)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class ParallelMesh:
    """The DeviceMesh with one dim per axis of the axis table (mesh_axes.AXES: dp, cfg, pp, ring, ulysses, tp) and
    the groups derived from them (mesh_axes.DERIVED_GROUPS: sp, image)."""

    config: ParallelConfig
    mesh: DeviceMesh
    device: torch.device
    derived: dict[MeshAxis, DeviceMesh]  # each derived group's axes flattened into one dim

    @classmethod
    def build(cls, config: ParallelConfig, device: torch.device) -> "ParallelMesh":
        config.validate(dist.get_world_size())
        shape = tuple(config.degrees[a] for a in MESH_AXES)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=tuple(a.value for a in MESH_AXES))
        # NOTE: flattening creates a process group, so every rank builds every derived group here,
        # in the table's order, whether or not it uses it.
        derived = {g.name: mesh[tuple(a.value for a in g.axes)]._flatten(g.name.value) for g in DERIVED_GROUPS}
        return cls(config, mesh, device, derived)

    def _axis(self, axis: MeshAxis) -> DeviceMesh:
        axis = MeshAxis(axis)  # a misspelt name fails here: ValueError "... is not a valid MeshAxis"
        return self.derived[axis] if axis in self.derived else self.mesh[axis.value]

    def group(self, axis: MeshAxis) -> dist.ProcessGroup:
        return self._axis(axis).get_group()

    def size(self, axis: MeshAxis) -> int:
        return self._axis(axis).size()

    def local_rank(self, axis: MeshAxis) -> int:
        return self._axis(axis).get_local_rank()

    @property
    def world_group(self) -> dist.ProcessGroup:
        """Every rank of the mesh (the mesh covers the whole world)."""
        return dist.group.WORLD

    @property
    def is_output_rank(self) -> bool:
        """The rank that writes images and prints: global rank 0."""
        return dist.get_rank() == 0


@dataclass
class SingleProcessMesh:
    """The mesh of an engine given none: one process, every axis of size 1, no process group needed.

    Its groups are None, which meshdit.distributed.comm reads as "this process alone":
    the same code paths run, and nothing is sent.
    """

    device: torch.device
    config: ParallelConfig = field(default_factory=ParallelConfig)
    world_group = None
    is_output_rank = True

    def group(self, axis: MeshAxis) -> None:
        MeshAxis(axis)  # a misspelt name fails here as on a ParallelMesh
        return None

    def size(self, axis: MeshAxis) -> int:
        MeshAxis(axis)
        return 1

    def local_rank(self, axis: MeshAxis) -> int:
        MeshAxis(axis)
        return 0
