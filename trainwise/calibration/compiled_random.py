"""Calibration of random numbers drawn inside a compiled region: dropout as inductor
generates it (the profile's `compiled_random` rate; trainwise/estimator/step_time.py prices
the compiled regions' "random" rows with it).

Under torch.compile a dropout's mask is not the eager `bernoulli_` kernel: inductor draws
each number in the fused kernel from a counter-based generator of its own, and runs that
kernel on every thread the process has, where eager CPU `bernoulli_` runs on one. The two
rates differ with the thread count. So the eager `random` rate does not price a compiled
dropout; this times one.

It is timed as training runs it: on an input that requires a gradient, so the generated
kernel also writes the mask that backward reads, as a boolean tensor. Timed without a
gradient (no mask), as it was before, the lone dropout ran at about the eager rate at two
threads and 0.54 x it at one, while dropout inside real compiled blocks cost far more
(benchmarks/compiled_dropout.py). The mask is the difference: `python
benchmarks/compiled_mask.py` on the project's 2-core EPYC (AVX-512, torch 2.13, 65,536
fp32 elements) timed a compiled kernel storing a boolean tensor at 19 x eager's comparison
writing the same tensor, and a compiled dropout's forward at 1.8 x its time once the input
requires a gradient (484 against 270 us).

The rate is on the bytes the trace charges a compiled region's random ops (trainwise/trace
/fusion.py leaves them out of the fused groups and adds their eager work: on the CPU the
mask's `bernoulli_`, reading and writing it), counted by tracing the same dropout, so the
time model charges the timed seconds back. The rest of the compiled dropout (the scale, the
product with the input) is fused element-wise work the trace prices as such; next to the
generator's it is a few per cent of the time, left in the rate. The fit's fixed cost is
not kept: it is the call into the compiled function, which the time model prices as a
region call and a kernel launch (hardware/profile.py: COMPILED_*_HOST_S)."""

from __future__ import annotations

import torch

from trainwise.calibration.memory import element_counts
from trainwise.calibration.timing import Settings, fit, measure_sizes, synchronizer
from trainwise.hardware.profile import Rate

DROPOUT_P = 0.1


def _dropout(x):
    return torch.nn.functional.dropout(x, DROPOUT_P, True)


def measure_compiled_random(device: torch.device, settings: Settings) -> dict:
    """{"rate": Rate or None, "points": [[bytes, seconds]], "spread", "why" where nothing was
    measured}: a compiled fp32 dropout's training forward over sizes (its mask written for
    backward), on the bytes its random ops
    are charged in a compiled region. Compiles one function (seconds); where torch.compile
    fails here (no C++ compiler, no Triton) the rate is None and "why" says so."""
    import torch._dynamo

    try:
        found = _timed(device, settings)
    except Exception as err:  # noqa: BLE001 - inductor fails in many ways without its toolchain
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        return {"rate": None, "points": [], "spread": 0.0,
                "why": f"torch.compile failed on this machine ({type(err).__name__}: {reason}): nothing measured"}
    finally:
        torch._dynamo.reset()  # the compiled dropout is not kept past the measurement
    return {"rate": Rate(found.rate.per_s, 0.0), "fitted_fixed_s": found.rate.fixed_s,
            "points": [[x, t] for x, t in found.points], "spread": found.spread}


TRACED_ELEMENTS = 1024  # the trace's count is per element: one small dropout gives it


def random_bytes(elements: int, device: torch.device) -> int:
    """Bytes read + written by the random ops (trainwise/trace/op_costs.py: op class
    "random") of one fp32 dropout of `elements`, as the trace counts them."""
    from trainwise.calibration.memory import traced_work

    x = torch.rand(elements, device=device)
    return traced_work(lambda: _dropout(x), op_class="random")[0]


def _timed(device: torch.device, settings: Settings):
    # Dynamic shapes: one compilation serves every size.
    compiled = torch.compile(_dropout, dynamic=True)
    # Traced once, not at every size: the largest would run an eager dropout of 2^24 elements.
    per_element = random_bytes(TRACED_ELEMENTS, device) / TRACED_ELEMENTS

    def case(n: int):
        def make():
            # Requires a gradient: the compiled forward then writes backward's mask too.
            x = torch.rand(n, device=device, requires_grad=True)
            return lambda: compiled(x)
        return round(per_element * n), make

    return fit(measure_sizes([case(n) for n in element_counts(device, settings)], synchronizer(device), settings))
