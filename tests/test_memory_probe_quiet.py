"""The CPU memory probe keeps PyTorch's CPU-allocator log ("Memory block of unknown size was
allocated before the profiling started", C++ on fd 2) from a user's terminal, in a fresh
process (the log's counter is process-wide), and the measured peak is unchanged by it."""

import subprocess
import sys

PROBE = """
import torch
from trainwise.engine.memory_probe import MemoryProbe

older = [torch.randn(256) for _ in range(8)]  # blocks from before the profiler, freed inside it
probe = MemoryProbe(torch.device("cpu"), probe_step=0)
probe.step_begin(0, older)
older.clear()
kept = torch.ones(1024)
probe.step_end(0)
print(probe.snapshot().peak_allocated)
"""


def test_the_probe_step_does_not_print_the_allocators_unknown_block_line():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Memory block of unknown size" not in done.stderr, done.stderr
    assert int(done.stdout.split()[-1]) >= 8 * 256 * 4 + 1024 * 4  # the older blocks and the new one
