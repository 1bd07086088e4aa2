"""Shared test fixtures and markers.

`fault_log`: how a reliability test records the fault or bad input it tried, for
docs/reliability.md (see tests/fault_log.py). Tests that use it carry the `fault` marker.

Markers for choosing a subset (`make test` runs everything): `slow` (over about 10 s),
`distributed` (starts torchrun/gloo processes), `gpu` (needs CUDA: skipped without it).
The fast local subset is `pytest -m "not slow and not distributed"`.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from fault_log import FaultLog, FaultWatch

# Device profiles are cached per user (trainwise/hardware/profile.py); the tests must not
# read a profile this machine's user calibrated, nor write one into their cache. Set before
# any test (and any process a test starts, which inherits it) runs.
os.environ["TRAINWISE_CACHE"] = tempfile.mkdtemp(prefix="trainwise-test-cache-")

# No test reaches the Hugging Face Hub (this machine may have no network; a Hub id's
# config.json is read from a cache a test lays out): set before transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"

_SESSION_LOG = FaultLog()


@pytest.fixture(autouse=True)
def private_profile_cache(tmp_path_factory, monkeypatch):
    """Each test its own profile cache: a profile one test calibrates or corrects (they go
    to the cache by default) must not give another test's CPU estimate a step time."""
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path_factory.mktemp("profile-cache")))


@pytest.fixture(autouse=True)
def restored_determinism():
    """A run with --deterministic, or a CPU compile on two threads (engine/compile_atomic_add.py),
    turns torch's deterministic algorithms on for the process; in this one process that would
    reach every later test, so each test gets back the state it started with."""
    import torch

    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def pytest_configure(config):
    config.addinivalue_line("markers", "float8: needs torchao, which `make test` puts on the path in a second pass "
                                       "(tests/float8_package.py)")
    config.addinivalue_line("markers", "fault: injects a fault or a bad input and records it for "
                                       "docs/reliability.md (benchmarks/reliability_report.py)")
    config.addinivalue_line("markers", "slow: takes over about 10 s of CPU on its own")
    config.addinivalue_line("markers", "distributed: launches torchrun processes (gloo on the CPU)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


def pytest_collection_modifyitems(config, items):
    """A test that records faults is a fault test, whether or not it says so; a GPU test is
    skipped where there is no CUDA device."""
    for item in items:
        if "fault_log" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fault)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture
def fault_log(request):
    """`fault_log.watch(path)` before the fault and `fault_log.saved(checkpoint)` name what it
    must not destroy; `fault_log(kind=..., case=..., exit_code=..., message=...)`, after the
    test's assertions, once per fault or bad input tried, measures what was lost (a loss fails
    the test)."""
    watch = FaultWatch()

    def record(*, kind: str, case: str, exit_code: int | None, message: str) -> None:
        lost = watch.lost()
        if lost:
            pytest.fail(f"{case}: {len(lost)} of {len(watch.expected)} watched files lost or changed: "
                        + ", ".join(lost[:5]))
        _SESSION_LOG.add(request.node.nodeid, kind=kind, case=case, exit_code=exit_code, message=message,
                         lost=len(lost), watched=len(watch.expected))
    record.watch, record.saved = watch.watch, watch.saved
    return record


def pytest_sessionfinish(session, exitstatus):
    _SESSION_LOG.write()
