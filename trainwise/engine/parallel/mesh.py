"""The process group and the one DeviceMesh of a run, from torchrun's environment.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; a process without them is a one-device
run. The mesh has the Layout's dimensions, outermost first: pp, dp, fsdp, tp."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainwise.plan.layout import Layout, resolve_layout
from trainwise.plan.plan import Plan

# A rank stuck in a collective (its peer died, or diverged) raises after this long
# instead of waiting forever; torchrun then ends the whole job.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


@dataclass
class Distributed:
    """This process's place in the run. `mesh` is None for a one-device run."""

    rank: int
    world: int
    local_rank: int
    layout: Layout
    mesh: DeviceMesh | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def has_mesh(self) -> bool:
        """Whether this run goes through torch.distributed: several ranks, or one rank that
        shards (FSDP2 needs a process group even then)."""
        return self.mesh is not None

    def submesh(self, *names: str) -> DeviceMesh:
        return self.mesh[names if len(names) > 1 else names[0]]

    def coordinate(self, name: str) -> int:
        """This rank's index along mesh dimension `name` (0 without a mesh)."""
        return self.mesh.get_local_rank(name) if self.mesh is not None else 0

    @property
    def data_rank(self) -> int:
        """Which share of the data this rank reads: its place among the data-parallel ranks
        (tensor- and pipeline-parallel peers read the same micro-batches)."""
        return self.coordinate("dp") * self.layout.fsdp + self.coordinate("fsdp")


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_world_size() -> int:
    """The processes this one runs among: torchrun's WORLD_SIZE, else 1."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else 1


def start_distributed(plan: Plan, device_type: str, layout: Layout | None = None) -> Distributed:
    """Join the process group (gloo on CPU, NCCL on CUDA) and build the mesh; a one-device
    run gets a Distributed with no mesh, unless it shards (ZeRO-3 with CPU offload on one
    GPU: FSDP2 needs a process group, of one rank then). `layout`: the plan's Layout on
    the launched world size where the caller resolved it already (else resolved here)."""
    world = launched_world_size()
    if layout is None:
        layout = resolve_layout(plan, world)  # before joining: a bad layout fails on every rank alike
    if world == 1:
        if not layout.zero:
            return Distributed(0, 1, 0, layout, None)
        _single_rank_environment()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT)
    mesh = init_device_mesh(device_type, layout.mesh_shape, mesh_dim_names=Layout.MESH_DIMS)
    return Distributed(rank, world, local_rank, layout, mesh)


def _single_rank_environment() -> None:
    """torchrun's variables for a one-process group, unless they are set already."""
    import socket

    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)


def stop_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
