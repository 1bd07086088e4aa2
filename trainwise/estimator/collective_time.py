"""The time of one collective on the link its group uses, for the layout time model.

Costs follow NCCL's bus-bandwidth convention (its performance notes define the "bus
bandwidth" of a collective so that it is comparable with the link's speed): for B bytes
per rank over n ranks in a ring,

* all-reduce moves 2 (n - 1) / n x B over each rank's link (a reduce-scatter then an
  all-gather);
* all-gather and reduce-scatter move (n - 1) / n x B, B being the whole (gathered) tensor;
* a point-to-point send moves B once.

so the time is that volume over the bus bandwidth (a profile's collective `Rate.per_s`)
plus a latency. For the latency we take the link's fixed cost times ceil(log2 n): a ring's
2 (n - 1) steps are pipelined with the data for large messages, and for small ones NCCL
switches to tree algorithms whose latency grows with log n; n - 1 full latencies would
make a 1024-rank all-reduce of a small bucket take tens of milliseconds, which NCCL does
not.

A group whose ranks sit on one node uses the profile's collective rates (NVLink on a
catalog GPU that has it; PCIe between GPUs that have none; gloo on the CPU); a group
spanning nodes runs at the inter-node link's per-GPU rate (one network adapter per GPU, as
on DGX-class nodes: the slowest link of the ring sets its speed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainwise.common.errors import InputError
from trainwise.hardware.profile import DeviceProfile, Rate

# The default inter-node link: one 400 Gbit/s (NDR) InfiniBand adapter per GPU, as in
# DGX H100 and similar nodes; NCCL reaches about 80 % of the line rate across nodes.
DEFAULT_INTER_NODE_GBPS = 400.0
INTER_NODE_EFFICIENCY = 0.80
INTER_NODE_LATENCY_S = 10e-6
# The CPU with a calibrated profile that measured no collectives: gloo over shared memory,
# taken as a quarter of the memory bandwidth (each byte is copied and summed in several
# passes). Stated as assumed in the result's notes.
GLOO_MEMORY_FRACTION = 0.25
GLOO_LATENCY_S = 50e-6

_VOLUME = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "send_recv": lambda n: 1.0}


@dataclass(frozen=True)
class Topology:
    """How the ranks are spread over nodes: `gpus_per_node` consecutive ranks share a node;
    `inter_node_bytes_per_s` is each GPU's share of the link between nodes, one direction,
    nominal (None: DEFAULT_INTER_NODE_GBPS)."""

    gpus_per_node: int
    inter_node_bytes_per_s: float | None = None

    @classmethod
    def from_gbps(cls, gpus_per_node: int, inter_node_gbps: float | None = None) -> "Topology":
        """From `--gpus-per-node` and `--inter-node-gbps` (Gbit/s per GPU)."""
        if gpus_per_node < 1:
            raise InputError("--gpus-per-node", f"must be 1 or more; got {gpus_per_node}")
        if inter_node_gbps is not None and inter_node_gbps <= 0:
            raise InputError("--inter-node-gbps", f"must be a positive bandwidth in Gbit/s; got {inter_node_gbps}")
        return cls(gpus_per_node, None if inter_node_gbps is None else inter_node_gbps * 1e9 / 8)

    @property
    def inter_node_rate(self) -> Rate:
        nominal = self.inter_node_bytes_per_s or DEFAULT_INTER_NODE_GBPS * 1e9 / 8
        return Rate(nominal * INTER_NODE_EFFICIENCY, INTER_NODE_LATENCY_S)

    def spans_nodes(self, size: int, stride: int) -> bool:
        """Whether a group of `size` ranks `stride` apart (rank 0's group of a mesh
        dimension) has ranks on more than one node."""
        return size > 1 and (size - 1) * stride >= self.gpus_per_node


@dataclass(frozen=True)
class Link:
    """The link a group communicates over: its name and the rate of each collective."""

    name: str  # "NVLink", "PCIe", "gloo", "inter-node"
    rates: dict[str, Rate]
    assumed: bool = False  # a stated fallback rather than a profile or user figure


def intra_node_link(profile: DeviceProfile) -> Link:
    """The link between ranks of one node, from the profile."""
    name = "gloo" if profile.kind == "cpu" else "NVLink"
    if profile.collectives:
        return Link(name, dict(profile.collectives))
    if profile.kind == "cpu":
        rate = Rate(profile.memory.per_s * GLOO_MEMORY_FRACTION, GLOO_LATENCY_S)
        return Link("gloo", dict.fromkeys(_VOLUME, rate), assumed=True)
    if profile.host_to_device is not None:  # GPUs without NVLink talk through PCIe
        return Link("PCIe", dict.fromkeys(_VOLUME, profile.host_to_device))
    raise InputError("--profile", f"{profile.device_name} has no collective or PCIe rate to time communication "
                                  "with; run trainwise calibrate --nproc N on it")


def group_link(profile: DeviceProfile, topology: Topology, size: int, stride: int) -> Link:
    """The link of rank 0's group of `size` ranks `stride` apart."""
    if topology.spans_nodes(size, stride):
        return Link("inter-node", dict.fromkeys(_VOLUME, topology.inter_node_rate))
    return intra_node_link(profile)


def collective_seconds(kind: str, nbytes: float, ranks: int, link: Link) -> float:
    """Seconds of one `kind` collective ("all_reduce", "all_gather", "reduce_scatter",
    "send_recv") of `nbytes` per rank (the whole tensor for the gathers) over `ranks`."""
    if ranks <= 1 and kind != "send_recv" or nbytes <= 0:
        return 0.0
    rate = link.rates.get(kind) or next(iter(link.rates.values()))
    volume = _VOLUME[kind](ranks) * nbytes
    latency = rate.fixed_s * max(1, math.ceil(math.log2(max(ranks, 2))))
    return latency + volume / rate.per_s
