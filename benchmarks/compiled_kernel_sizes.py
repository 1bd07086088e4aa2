"""What a compiled kernel costs beyond its priced work, at calibrate's size and larger.

    python benchmarks/compiled_kernel_sizes.py --profile cpu.json [--widths 16,64,128,256]

An investigation, not a results page. calibrate prices a compiled region's host time per
kernel from chains of 16 x 16 blocks (trainwise/calibration/compiled_host.py): a line
through the chain's seconds at 1, 8 and 16 blocks, less the device work the time model
prices each block's kernels at, over the kernels a block launches. Compiled plans are
predicted too fast on this project's CPU (docs/results/time-model-cpu.md), so this times
the same chains at other widths and prints, per width, the timed points, a block's
seconds, its priced device work (the profile's rates), and what is left per kernel and per
region call. A per-kernel figure that grows with the width is work the time model misses
in a compiled kernel of a real step's size (threads forked and joined, a fused kernel
slower than the eager rates say), not host time that calibrate's tiny chain can see."""

from __future__ import annotations

import argparse
import sys

import provenance

provenance.add_repo_to_path()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="a profile written by `trainwise calibrate` on this device")
    parser.add_argument("--widths", default="16,64,128,256", help="block widths to try, comma-separated")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    widths = [int(w) for w in args.widths.split(",")]
    import torch
    import torch._dynamo

    from trainwise.calibration.compiled_host import block_device_seconds, compiled_host_costs, timed_chains
    from trainwise.calibration.timing import FULL
    from trainwise.hardware.allocator import keep_freed_memory
    from trainwise.hardware.profile import read_profile

    device = torch.device(args.device)
    if device.type == "cpu":
        keep_freed_memory()  # as calibrate and train run on a CPU
    profile = read_profile(args.profile)
    print(f"{provenance.device_description()}; commit {provenance.git_commit()}; {provenance.versions()}; "
          f"1-minute load average {provenance.load_average()}; profile {args.profile}")
    print("times in us, measured; 'priced device work' is the time model's, at the profile's rates")
    for width in widths:
        try:
            points = timed_chains(device, FULL, width)
        finally:
            torch._dynamo.reset()
        device_s = block_device_seconds(profile, width) if device.type == "cpu" else 0.0
        found = compiled_host_costs(points, device_s)
        per_block = found.get("seconds_per_block")
        left = (per_block - device_s) / found["kernels_per_block"] if per_block else None
        print(f"width {width:4d}: chains " + ", ".join(f"{b} blocks {s * 1e6:.1f}" for b, s in points)
              + (f"; a block {per_block * 1e6:.1f}, priced device work {device_s * 1e6:.1f}, "
                 f"left per kernel {left * 1e6:.2f}" if per_block else "; the time did not grow with the blocks")
              + (f", per region call {found['region_s'] * 1e6:.1f}" if found.get("region_s") else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
