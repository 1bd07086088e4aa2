"""The host seconds of a compiled kernel and of a call into a compiled region, read off the
reference model's own training steps compiled block by block and whole, on the CPU.

calibrate's compiled chain (compiled_host.py) prices them on blocks of 16 x 16 tensors: a
matmul and a tanh, a region of one Linear's worth of inputs. A real transformer block is
not that. On the project's 2-core EPYC (`trainwise train tiny-llama --device cpu --seq-len
64 --batch-size 4 --steps 80 [--compile --compile-scope S]` in fresh processes, twice each,
beside `trainwise estimate` of the same plans with a fresh profile) tiny-llama's step
compiled per block ran 0.80-0.99 x its eager step where the chain's figures predicted
0.71 x; compiled whole, 0.75-0.79 x against 0.60 x. On the time-model page every compiled
plan was predicted too fast, by 3-31 %. Read with torch.profiler (inductor's kernels
recorded), the step's fused kernels took less than their priced device work; the time went
between them: inductor's generated wrapper allocating buffers and calling each kernel and
extern matmul in Python, the Dynamo cache lookup over a block's guards, and AOTAutograd's
autograd function saving and handing back a block's tensors, none of which the chain's
tiny region has much of.

So the pair is measured where it is paid: the reference model's step (deepened to BLOCKS
blocks) at CHECKPOINTED's size plain, compiled per block and compiled whole, timed side by
side in interleaved blocks (host_time.py: InterleavedSteps). Each compiled step less the plain one, less what
the time model predicts that difference to be with both host figures at 0, is what the
compiled step's kernels and region calls cost the host; the time model counts those (a
per-block step has two region calls a block, a whole-model one two in all), so the two
steps give the two unknowns:

    rise(scope) - predicted rise at (0, 0) = kernels(scope) x kernel + calls(scope) x region

As with the recomputed op's host time, a difference of two measured steps leaves out what
the model gets wrong about the plain step. Where the two steps cannot give a positive pair
(noise on a busy machine), one figure is held at the chain's and the other read from the
step that depends on it most; where neither can, nothing is fitted and the chain's pair
stands, with why."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainwise.calibration.timing import Settings
from trainwise.hardware.profile import DeviceProfile

SCOPES = ("blocks", "model")
# The reference model deepened to this many blocks: compiled per block its step has two
# region calls a block, compiled whole two in all, while both have about as many kernels a
# block. At the catalog's 2 blocks (4 calls against 2, 72 kernels against 77) the two steps
# hardly told a region call from a kernel: a 0.1 ms difference between them moved the
# region call's figure by 47 us; at 8 (16 calls against 2), by 7 us.
BLOCKS = 8


def measure_compiled_steps(device: torch.device, fitted: DeviceProfile, settings: Settings) -> dict:
    """{"kernel_s", "region_s", "steps": [...], "why"?}: the host seconds per compiled kernel
    and per region call that the reference model's compiled steps leave (module docstring),
    `fitted` the profile with every other figure in place (its compiled pair, the chain's,
    is the fallback). None for a figure not fitted."""
    from trainwise.calibration.host_time import (CHECKPOINTED, REFERENCE_MODEL, interleaved_blocks,
                                                 priced_under_profiles, spread, time_interleaved_steps)
    from trainwise.hardware.resolve import resolve_device
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan
    from trainwise.trace.depth import with_blocks

    cpu = resolve_device("cpu")
    reference = resolve_model(REFERENCE_MODEL)
    model = dataclasses.replace(reference, name=f"{REFERENCE_MODEL} at {BLOCKS} blocks",
                                config=with_blocks(reference.config, BLOCKS))
    plain = Plan(batch_size=CHECKPOINTED[0], seq_len=CHECKPOINTED[1], device="cpu")
    plans = [plain] + [plain.replace(compile=True, compile_scope=scope) for scope in SCOPES]
    try:
        blocks = time_interleaved_steps(device, plans, *interleaved_blocks(settings), model)
    except Exception as err:  # noqa: BLE001 - inductor fails in many ways without its toolchain
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        return {"kernel_s": None, "region_s": None, "steps": [],
                "why": f"torch.compile failed on this machine ({type(err).__name__}: {reason}): nothing fitted"}
    finally:
        import torch._dynamo

        torch._dynamo.reset()  # the steps' compiled code is not kept past the measurement
    predicted_plain = priced_under_profiles(plain, cpu, [fitted], model)[0].time.step_s
    steps = []
    for scope, plan, timed in zip(SCOPES, plans[1:], blocks[1:]):
        free, per_kernel, per_region = (priced.time.step_s for priced in priced_under_profiles(plan, cpu, [
            dataclasses.replace(fitted, host_s_per_compiled_kernel=k, host_s_per_compiled_region=r)
            for k, r in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))], model))
        rises = [compiled - alone for compiled, alone in zip(timed, blocks[0])]
        steps.append({"scope": scope, "blocks": BLOCKS, "batch_size": plan.batch_size, "seq_len": plan.seq_len,
                      "step_s": statistics.median(timed), "spread": spread(timed),
                      "plain_step_s": statistics.median(blocks[0]), "plain_spread": spread(blocks[0]),
                      "measured_rise_s": statistics.median(rises), "rise_spread": spread(rises),
                      "predicted_plain_s": predicted_plain, "predicted_without_compiled_host_s": free,
                      "kernels": per_kernel - free, "region_calls": per_region - free})
    found = kernel_and_region_host(steps, fitted.compiled_kernel_host_s, fitted.compiled_region_host_s)
    return {**found, "steps": steps}


def kernel_and_region_host(steps: list[dict], chain_kernel_s: float, chain_region_s: float) -> dict:
    """{"kernel_s", "region_s", "why"?} through the compiled steps (each {"measured_rise_s",
    "predicted_without_compiled_host_s", "predicted_plain_s", "kernels", "region_calls"}):
    what each step's compiled host costs (its measured rise over the plain step less the
    rise predicted without compiled host time) solved for one figure per kernel and one per
    region call. Where the solution is not positive in both, the figure the steps read less
    surely is held at the chain's (`chain_*_s`) and the other read from the step with the
    most of it; where that is not positive either, both are None (the chain's pair stands)."""
    left = [step["measured_rise_s"] - (step["predicted_without_compiled_host_s"] - step["predicted_plain_s"])
            for step in steps]
    (k1, r1), (k2, r2) = ((step["kernels"], step["region_calls"]) for step in steps)
    determinant = k1 * r2 - k2 * r1
    if determinant:
        kernel = (left[0] * r2 - left[1] * r1) / determinant
        region = (k1 * left[1] - k2 * left[0]) / determinant
        if kernel > 0 and region > 0:
            return {"kernel_s": kernel, "region_s": region}
    # One figure from one step: the kernels' from the step with the fewest region calls per
    # kernel (compiled whole), the region calls' from the other, the second held at the chain's.
    whole, blocks = sorted(range(2), key=lambda i: steps[i]["region_calls"] / max(steps[i]["kernels"], 1e-9))
    kernel = ((left[whole] - steps[whole]["region_calls"] * chain_region_s) / steps[whole]["kernels"]
              if steps[whole]["kernels"] > 0 else 0.0)
    if kernel > 0:
        return {"kernel_s": kernel, "region_s": None,
                "why": "the two steps gave no positive pair: the region call's figure is the chain's"}
    region = ((left[blocks] - steps[blocks]["kernels"] * chain_kernel_s) / steps[blocks]["region_calls"]
              if steps[blocks]["region_calls"] > 0 else 0.0)
    if region > 0:
        return {"kernel_s": None, "region_s": region,
                "why": "the two steps gave no positive pair: the kernel's figure is the chain's"}
    return {"kernel_s": None, "region_s": None,
            "why": "the compiled steps left no positive host time beyond the prediction: the chain's figures stand"}
