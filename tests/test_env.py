"""`trainwise env`: link names as nvidia-smi prints them, NVML read through a stand-in,
and the no-GPU report of this machine."""

import json
import sys
import types

import pytest

from trainwise.cli.main import main
from trainwise.hardware.topology import link_from, read_links


@pytest.mark.parametrize("nvlinks, level, label", [(4, 50, "NV4"), (0, 10, "PIX"), (0, 20, "PXB"),
                                                   (0, 30, "PHB"), (0, 40, "NODE"), (0, 50, "SYS"),
                                                   (0, None, "?")])
def test_link_labels(nvlinks, level, label):
    assert link_from(nvlinks, level).label == label


def _fake_nvml(nvlinked_pairs: dict, ancestor: int):
    """Three GPUs; `nvlinked_pairs[(i, j)]` links join i to j; other pairs share `ancestor`."""
    buses = ["00000000:0A:00.0", "00000000:0B:00.0", "00000000:0C:00.0"]
    module = types.SimpleNamespace(NVML_FEATURE_ENABLED=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None)
    module.nvmlDeviceGetHandleByPciBusId = lambda bus: buses.index(bus)
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=buses[h].encode())
    remote = {(i, link): j for (i, j), n in nvlinked_pairs.items() for link in range(n)}
    remote.update({(j, link + 10): i for (i, j), n in nvlinked_pairs.items() for link in range(n)})

    def state(handle, link):
        if (handle, link) not in remote:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    module.nvmlDeviceGetNvLinkState = state
    module.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=buses[remote[(h, link)]])
    module.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: ancestor
    return buses, module


def test_links_read_through_nvml(monkeypatch):
    buses, fake = _fake_nvml({(0, 1): 4}, ancestor=50)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    links = read_links(buses)
    labels = [[link.label if link else "X" for link in row] for row in links]
    assert labels == [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]


def test_links_unknown_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert read_links(["00000000:0A:00.0", "00000000:0B:00.0"]) is None


def test_env_reports_this_machine(capsys):
    import torch

    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"] == torch.__version__ and "gloo" in report["distributed_backends"]
    assert report["packages"]["transformers"] and "bitsandbytes" in report["packages"]
    if not torch.cuda.is_available():
        assert report["gpus"] == [] and report["gpu_note"].startswith("no GPU")
    assert main(["env"]) == 0
    assert "Optional packages" in capsys.readouterr().out
