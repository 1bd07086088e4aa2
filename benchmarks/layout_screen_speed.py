"""How long the plan search's layout screen takes on the issue's two large cases, from a cold
cache (the traces of each tensor-parallel degree included), and how many layouts it priced.

    python benchmarks/layout_screen_speed.py            # both cases
    python benchmarks/layout_screen_speed.py --case 70b

Prints wall-clock seconds, the machine's load average (a busy machine reads slower), the
candidates priced and the best few. Where the step-time model gives no compute seconds
(no EstimateResult.time), compute is left at 0 and said so: the timing then covers the
traces, the memory arithmetic and the communication model, not the ranking's quality."""

from __future__ import annotations

import argparse
import os
import time

CASES = {"70b": ("Llama-3.1-70B", 64, 8, 512), "405b": ("Llama-3.1-405B", 1024, 8, 2048)}


def seconds_or_nothing(result):
    from trainwise.search.traced_unit import time_model_seconds

    if getattr(result, "time", None) is None:
        return 0.0, 0.0, 0.0
    return time_model_seconds(result)


def run(case: str) -> None:
    from trainwise.hardware import resolve_device
    from trainwise.hardware.catalog_profile import catalog_profile
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan
    from trainwise.search.layout_enumeration import LayoutSpace
    from trainwise.search.layout_screen import screen_layouts

    model, gpus, per_node, global_batch = CASES[case]
    start = time.perf_counter()
    spec = resolve_model(model)
    device = resolve_device("H100")
    plan = Plan(device="H100", precision="bf16", seq_len=4096, grad_ckpt=True)
    space = LayoutSpace(gpus=gpus, gpus_per_node=per_node, global_batch=global_batch)
    candidates = screen_layouts(spec, plan, device, catalog_profile(device), space, seconds_of=seconds_or_nothing)
    elapsed = time.perf_counter() - start
    capacity = device.memory_bytes
    fits = [c for c in candidates if c.memory_bytes <= capacity]
    print(f"{model} on {gpus} x H100 ({per_node} per node), global batch {global_batch}, seq 4096: "
          f"{len(candidates)} layouts screened, {len(fits)} fit, {elapsed:.1f} s wall "
          f"(measured; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for candidate in fits[:5]:
        p = candidate.plan
        print(f"  predicted {candidate.memory_bytes / 2**30:6.1f} GiB  {candidate.step_s:8.3f} s/step  "
              f"tp={p.tp} pp={p.pp} dp={p.dp} fsdp={p.fsdp} zero={p.zero} offload={p.cpu_offload} "
              f"sp={p.sequence_parallel} micro={p.batch_size} accum={p.grad_accum} "
              f"{p.pp_schedule if p.pp > 1 else ''} {p.microbatches or ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    for case in parser.parse_args().case or sorted(CASES):
        run(case)


if __name__ == "__main__":
    main()
