"""How each pair of GPUs is linked, read through NVML, in `nvidia-smi topo -m`'s words.

NV<n>: n NVLink links join the pair directly. Otherwise the PCIe path, from the closest
ancestor the two share: PIX (one PCIe switch), PXB (several switches, no host bridge), PHB
(a host bridge: through the CPU's root complex), NODE (host bridges within one NUMA node),
SYS (across NUMA nodes: the CPU interconnect, slowest). This matters for the layout: tensor
parallel wants NVLink pairs, pipeline parallel tolerates SYS.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.common.nvml import nvml_session

# NVML's nvmlGpuTopologyLevel_t values, in order of distance.
_PATH_BY_LEVEL = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PATH_MEANING = {
    "NV": "NVLink, direct",
    "PIX": "PCIe, one switch",
    "PXB": "PCIe, several switches",
    "PHB": "PCIe through a CPU host bridge",
    "NODE": "PCIe across host bridges of one NUMA node",
    "SYS": "PCIe plus the CPU interconnect between NUMA nodes",
}
_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper; older parts answer fewer


@dataclass(frozen=True)
class Link:
    """The connection from one GPU to another."""

    kind: str  # "NV" or a PCIe path name
    nvlinks: int = 0

    @property
    def label(self) -> str:
        return f"NV{self.nvlinks}" if self.kind == "NV" else self.kind


def link_from(nvlinks: int, common_ancestor_level: int | None) -> Link:
    """The Link of a pair: NVLink when any links join them, else the PCIe path."""
    if nvlinks > 0:
        return Link("NV", nvlinks)
    return Link(_PATH_BY_LEVEL.get(common_ancestor_level, "?"))


def read_links(pci_bus_ids: list[str]) -> list[list[Link | None]] | None:
    """Matrix of links between the GPUs with these PCI bus ids (None on the diagonal), or
    None when NVML is not available."""
    with nvml_session() as pynvml:
        if pynvml is None:
            return None
        try:
            handles = [pynvml.nvmlDeviceGetHandleByPciBusId(bus) for bus in pci_bus_ids]
            buses = [_normal_bus(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
            return [[None if i == j else link_from(_nvlinks_to(pynvml, handles[i], buses[j]),
                                                   _ancestor(pynvml, handles[i], handles[j]))
                     for j in range(len(handles))] for i in range(len(handles))]
        except Exception:  # noqa: BLE001 - NVML present but refusing (containers, old drivers)
            return None


def _nvlinks_to(pynvml, handle, remote_bus: str) -> int:
    count = 0
    for link in range(_MAX_NVLINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            if _normal_bus(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId) == remote_bus:
                count += 1
        except Exception:  # noqa: BLE001 - link index beyond this part, or no NVLink at all
            continue
    return count


def _ancestor(pynvml, a, b) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except Exception:  # noqa: BLE001
        return None


def _normal_bus(bus) -> str:
    """NVML bus ids come as bytes or str, with 8- or 4-digit domains: compare the tail."""
    text = bus.decode() if isinstance(bus, bytes) else str(bus)
    return text.upper()[-12:]
