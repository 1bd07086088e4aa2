"""Calibration: measuring a device into a profile (`trainwise calibrate`). Each module times
one kind of work and fits it to a Rate of `hardware/profile.py`: tensor contractions
(`compute.py`), memory-bound work and the optimizer step (`memory.py`), collectives between
local processes (`collectives.py`), the host time under torch.compile
(`compiled_host.py`), on a GPU the device memory outside the caching allocator
(`context.py`), and on the CPU a real training step's host time per op
(`host_time.py`) and how much slower its matmuls run inside the step than alone
(`replay.py`); `timing.py` times a small piece of work honestly and fits the rate.
`api/calibrate.py` runs them and writes the profile."""
