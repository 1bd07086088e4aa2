"""Validate memory estimates against real training steps on this machine's CUDA GPU.

For each configuration a fresh Python process (memory handed to the CUDA caching allocator
never comes back otherwise) builds the real model with random weights, applies the plan's
recipe (`trainwise.techniques`), creates the optimizer state, resets the peak statistics and runs
two full optimizer steps. It reports `torch.cuda.max_memory_allocated()`,
`torch.cuda.max_memory_reserved()` and the GPU memory NVML shows for the process (what
nvidia-smi shows). The prediction, `trainwise.api.estimate` for device "cuda" (the GPU
detected here), is made in the parent process, which never touches the GPU.

Writes each row, with the launch's provenance, to a rows file as it goes (--rows; default
docs/results/rows/memory-<gpu>-<UTC time>.json), and at the end renders the Markdown page
docs/results/memory-<gpu>.md (or --out) from it with benchmarks/render_memory.py, which
also merges the rows files of several launches into one page.

    python benchmarks/validate_memory.py            # the full matrix (>= 20 configurations)
    python benchmarks/validate_memory.py --quick    # 5 configurations
    python benchmarks/validate_memory.py --list     # print the matrix and exit

Without a CUDA GPU it prints "skipped: no CUDA GPU" and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import provenance  # noqa: E402  (benchmarks/, next to this script)
from render_memory import error_pct, render_page, summarize  # noqa: E402

REPO = provenance.REPO
provenance.add_repo_to_path()  # runnable as a plain script from a checkout

CHILD_TIMEOUT_S = 1800
GiB = 1024**3


@dataclass(frozen=True)
class Config:
    """One row of the matrix: a model, its task and the plan knobs (device is added)."""

    name: str
    model: str
    task: str
    knobs: dict = field(hash=False)
    needs: tuple[str, ...] = ()  # importable packages the configuration requires

    def plan_dict(self) -> dict:
        return {**self.knobs, "device": "cuda"}


def _bert(name: str, **knobs) -> Config:
    """bert-large-uncased sequence classification at 512 tokens (the classic single-GPU
    guide's ladder: batch 4 with every memory technique added one at a time). Attention is
    the Plan's default, sdpa, unless a row says eager."""
    needs = ("bitsandbytes",) if knobs.get("optim") == "adamw-8bit" else ()
    return Config(name, "bert-large-uncased", "seq-cls", {"batch_size": 4, "seq_len": 512, **knobs}, needs)


def _llama(name: str, **knobs) -> Config:
    """Llama-3.2-1B causal LM at 2048 tokens, bf16 mixed precision unless said otherwise."""
    return Config(name, "Llama-3.2-1B", "causal-lm", {"seq_len": 2048, "precision": "bf16", **knobs},
                  _gpu_packages(knobs))


def _gpu_packages(knobs: dict) -> tuple[str, ...]:
    """The optional packages (pip install 'trainwise[gpu]') a row's GPU-only knobs need."""
    return (("liger_kernel",) if knobs.get("kernels") == "liger" else ()) + (("torchao",) if knobs.get("float8") else ())


def _task(name: str, model: str, task: str, **knobs) -> Config:
    """A model of a task beyond text (issue 18): images, audio, image + text, bf16 mixed
    precision unless said otherwise; seq_len is what the task makes of it (docs/train.md)."""
    return Config(name, model, task, {"precision": "bf16", **knobs})


ONE_BY_FOUR = {"batch_size": 1, "grad_accum": 4}

MATRIX: tuple[Config, ...] = (
    _bert("bert b4"),
    _bert("bert b1x4", **ONE_BY_FOUR),
    _bert("bert b1x4 ckpt", **ONE_BY_FOUR, grad_ckpt=True),
    _bert("bert b4 fp16", precision="fp16"),
    _bert("bert b1x4 ckpt fp16", **ONE_BY_FOUR, grad_ckpt=True, precision="fp16"),
    _bert("bert b4 adafactor", optim="adafactor"),
    _bert("bert b1x4 ckpt fp16 adafactor", **ONE_BY_FOUR, grad_ckpt=True, precision="fp16", optim="adafactor"),
    _bert("bert b4 adamw-8bit", optim="adamw-8bit"),
    _bert("bert b1x4 ckpt fp16 adamw-8bit", **ONE_BY_FOUR, grad_ckpt=True, precision="fp16", optim="adamw-8bit"),
    _bert("bert b4 bf16", precision="bf16"),
    _bert("bert b4 eager", attention="eager"),
    _bert("bert b4 bf16 eager", precision="bf16", attention="eager"),
    _llama("llama-1b b1 bf16", batch_size=1),
    _llama("llama-1b b2 bf16", batch_size=2),
    _llama("llama-1b b4 bf16", batch_size=4),
    _llama("llama-1b b1 bf16 ckpt", batch_size=1, grad_ckpt=True),
    _llama("llama-1b b4 bf16 ckpt", batch_size=4, grad_ckpt=True),
    _llama("llama-1b b4 bf16 selective ckpt", batch_size=4, grad_ckpt=True, grad_ckpt_policy="selective"),
    _llama("llama-1b b4 bf16 ckpt every 2", batch_size=4, grad_ckpt=True, grad_ckpt_every=2),
    _llama("llama-1b b4 bf16 lora16", batch_size=4, lora_rank=16),
    _llama("llama-1b b4 bf16 lora16 ckpt", batch_size=4, lora_rank=16, grad_ckpt=True),
    _llama("llama-1b b2 bf16-pure", batch_size=2, precision="bf16-pure"),
    _llama("llama-1b b4 bf16-pure ckpt", batch_size=4, precision="bf16-pure", grad_ckpt=True),
    _llama("llama-1b b2 bf16 adamw-fused", batch_size=2, optim="adamw-fused"),
    # --activation-offload: the device peak without the blocks' saved tensors (host copies).
    _llama("llama-1b b4 bf16 act-offload", batch_size=4, activation_offload=True),
    _llama("llama-1b b4 bf16 ckpt act-offload", batch_size=4, grad_ckpt=True, activation_offload=True),
    # GPU-only knobs (issue 17). --kernels liger is predicted from a traced stand-in that
    # keeps what Liger's kernels keep (docs/estimate.md, Fused kernels) and measured with
    # Liger's Triton kernels; with --loss fused its loss is Liger's fused linear
    # cross-entropy. The float8 rows are eager here and in the estimate (the run needs
    # --compile for speed, not for its memory to be compared).
    _llama("llama-1b b4 bf16 liger", batch_size=4, kernels="liger"),
    _llama("llama-1b b4 bf16 ckpt liger", batch_size=4, grad_ckpt=True, kernels="liger"),
    _llama("llama-1b b4 bf16 ckpt liger fused-loss", batch_size=4, grad_ckpt=True, kernels="liger", loss="fused"),
    _llama("llama-1b b4 bf16 float8", batch_size=4, float8=True),
    _llama("llama-1b b4 bf16-pure ckpt float8", batch_size=4, precision="bf16-pure", grad_ckpt=True, float8=True),
    _llama("llama-1b b4 bf16 packed documents", batch_size=4, packing="documents"),
    Config("llama-1b b1 bf16 packed documents flash", "Llama-3.2-1B", "causal-lm",
           {"seq_len": 2048, "precision": "bf16", "batch_size": 1, "packing": "documents", "attention": "flash"},
           ("flash_attn",)),
    _llama("llama-1b b4 bf16 ckpt fused-loss", batch_size=4, grad_ckpt=True, loss="fused"),
    # Tasks beyond text (issue 18): image classifiers at 224 px, Whisper with 128 text
    # tokens, Wav2Vec2 on 10 s of 16 kHz audio, LLaVA-1.5-7B with its 576 image tokens.
    _task("vit-base b64 bf16", "vit-base-patch16-224", "image-cls", batch_size=64, seq_len=196),
    _task("vit-base b64 bf16 ckpt", "vit-base-patch16-224", "image-cls", batch_size=64, seq_len=196, grad_ckpt=True),
    _task("swin-tiny b64 bf16", "swin-tiny-patch4-window7-224", "image-cls", batch_size=64, seq_len=3136),
    _task("convnext-tiny b64 bf16", "convnext-tiny-224", "image-cls", batch_size=64, seq_len=3136),
    _task("whisper-small b16 bf16", "whisper-small", "speech-seq2seq", batch_size=16, seq_len=128),
    _task("wav2vec2-base b8 bf16", "wav2vec2-base-960h", "ctc", batch_size=8, seq_len=160000),
    _task("llava-7b b1 bf16-pure ckpt lora16", "llava-1.5-7b", "vision-lm", batch_size=1, seq_len=1024,
          precision="bf16-pure", grad_ckpt=True, lora_rank=16),
)

QUICK = ("bert b4", "bert b1x4 ckpt fp16", "bert b4 adafactor", "llama-1b b1 bf16", "llama-1b b4 bf16 lora16 ckpt")


# ================================================================== child: one real run
def run_config(config: Config, device: str = "cuda", steps: int = 2) -> dict:
    """Run `steps` optimizer steps of `config` for real and measure them.

    The step is the tracer's: optimizer state created first with stand-in (zero) gradients;
    then per step `grad_accum` micro-batches (forward under autocast for mixed precision,
    backward of loss / grad_accum, fp16 through a GradScaler), clipping when
    max_grad_norm > 0, optimizer.step(), zero_grad(set_to_none=True).

    `device` may be "cpu" to check this code path without a GPU (no memory figures then)."""
    import torch

    from trainwise.models import build_model, example_batch, resolve_model
    from trainwise.plan.plan import Plan
    from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model

    plan = Plan.from_dict({**config.knobs, "device": device})
    spec = resolve_model(config.model, task=config.task)
    device_type = torch.device(device).type
    policy = precision_policy(plan.precision, device_type)
    if policy.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    # Built and prepared on the CPU, then moved: parameters then reach the GPU one by one
    # in module order (as from a checkpoint), with no initialisation temporaries cached.
    model = build_model(spec, "cpu", attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
    model = prepare_model(model, plan, policy, spec.task)
    model.to(device)
    optimizer = build_optimizer(plan, model, device_type)
    for p in model.parameters():  # optimizer state exists before the measured steps
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scaler = torch.amp.GradScaler(device_type) if policy.loss_scaling else None
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    losses = []
    started = time.perf_counter()
    for _ in range(steps):
        for _ in range(plan.grad_accum):
            batch = example_batch(spec, plan.batch_size, plan.seq_len, device=device, generator=generator,
                                  documents=plan.packing == "documents")
            with _autocast(policy, device_type):
                loss = compute_loss(model, batch) / plan.grad_accum
            (scaler.scale(loss) if scaler else loss).backward()
            losses.append(float(loss.detach()))
            del loss, batch
        trainable = [p for p in model.parameters() if p.grad is not None]
        if scaler:
            scaler.unscale_(optimizer)
        if plan.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainable, plan.max_grad_norm, foreach=True)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    result = {"status": "ok", "time_s": round(time.perf_counter() - started, 3), "final_loss": losses[-1]}
    if cuda:
        result.update(peak_allocated=torch.cuda.max_memory_allocated(),
                      peak_reserved=torch.cuda.max_memory_reserved(),
                      reserved_at_end=torch.cuda.memory_reserved())
        result.update(_process_gpu_memory())
    return result


def _autocast(policy, device_type: str):
    import contextlib

    import torch

    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=policy.autocast_dtype)


def _process_gpu_memory() -> dict:
    """GPU memory used by this process as nvidia-smi reports it: {"device_total", "nvml_source"}."""
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = _nvml_handle_of_current_device(pynvml)
            for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                for proc in query(handle):
                    if proc.pid == pid and proc.usedGpuMemory is not None:
                        return {"device_total": int(proc.usedGpuMemory), "nvml_source": "pynvml (per process)"}
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            baseline = int(os.environ.get("TRAINWISE_BASELINE_USED", "0"))
            return {"device_total": used - baseline,
                    "nvml_source": "pynvml device used minus the baseline before this process (pid not visible)"}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml missing or failing: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == str(pid):
                return {"device_total": int(float(parts[1]) * 1024**2), "nvml_source": "nvidia-smi (per process, MiB)"}
    except Exception:
        pass
    return {"device_total": None, "nvml_source": "unavailable"}


def _nvml_handle_of_current_device(pynvml):
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = str(getattr(props, "uuid", ""))
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def child_main(config_json: str) -> int:
    config = _config_from_json(config_json)
    try:
        import torch

        try:
            result = run_config(config)
        except torch.cuda.OutOfMemoryError as error:
            result = {"status": "oom", "reason": str(error).splitlines()[0][:300]}
    except Exception as error:  # reported as a row, never fatal for the matrix
        result = {"status": "error", "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _config_to_json(config: Config) -> str:
    return json.dumps(asdict(config))


def _config_from_json(text: str) -> Config:
    data = json.loads(text)
    return Config(data["name"], data["model"], data["task"], data["knobs"], tuple(data.get("needs", ())))


# ================================================================== parent: predict, spawn, report
def predict(config: Config) -> dict:
    """The estimate for `config` on the detected CUDA device (no GPU work)."""
    from trainwise.api import estimate
    from trainwise.plan.plan import Plan

    try:
        result = estimate(config.model, Plan.from_dict(config.plan_dict()), task=config.task)
    except Exception as error:
        return {"status": "error", "reason": f"{type(error).__name__}: {error}"}
    memory = result.memory
    return {"status": "ok", "peak_allocated": memory.peak_allocated, "peak_reserved": memory.peak_reserved,
            "device_total": memory.device_total, "context": memory.context, "device_name": result.device.name}


def measure(config: Config, baseline_used: int | None) -> dict:
    """Run `config` in a fresh interpreter and return its measurements."""
    missing = [name for name in config.needs if not _importable(name)]
    if missing:
        return {"status": "skipped", "reason": f"needs {', '.join(missing)}"}
    env = dict(os.environ)
    if baseline_used is not None:
        env["TRAINWISE_BASELINE_USED"] = str(baseline_used)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", _config_to_json(config)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"status": "error", "reason": f"child exited {done.returncode}: {tail[0][:300]}"}


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _device_used_bytes() -> int | None:
    """Device memory in use now (all processes), for the no-per-process-figure fallback."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "gpu"


def _metadata(argv: list[str], trainwise_device: str) -> dict:
    import torch
    import transformers

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name, "gpu_memory_gib": props.total_memory / GiB, "trainwise_device": trainwise_device,
        "driver": _driver_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "peft": _version("peft"), "bitsandbytes": _version("bitsandbytes"),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "benchmarks/validate_memory.py", *map(shlex.quote, argv)]),
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            value = pynvml.nvmlSystemGetDriverVersion()
            return value.decode() if isinstance(value, bytes) else str(value)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def select(quick: bool, only: str | None) -> list[Config]:
    configs = [c for c in MATRIX if c.name in QUICK] if quick else list(MATRIX)
    if only:
        configs = [c for c in configs if re.search(only, c.name)]
    return configs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"run {len(QUICK)} configurations instead of {len(MATRIX)}")
    parser.add_argument("--out", type=Path, help="Markdown file to write (default docs/results/memory-<gpu>.md)")
    parser.add_argument("--rows", type=Path,
                        help="rows file to write as rows finish (default docs/results/rows/memory-<gpu>-<time>.json)")
    parser.add_argument("--only", help="regular expression: run only configurations whose name matches")
    parser.add_argument("--list", action="store_true", help="print the configurations and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    configs = select(args.quick, args.only)
    if args.list:
        for config in configs:
            print(f"{config.name:34s} {config.model} {config.task} {config.knobs}")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU")
        return 0
    from trainwise.common.atomic import atomic_write_text

    command = provenance.script_command("validate_memory.py", argv)
    prov = provenance.collect(command)
    meta = _metadata(argv, "cuda")
    stamp = prov["date"].replace(" ", "-").replace(":", "")
    rows_file = args.rows or REPO / "docs" / "results" / "rows" / f"memory-{_slug(meta['gpu'])}-{stamp}.json"
    rows = []
    baseline_used = _device_used_bytes()
    for index, config in enumerate(configs, 1):
        predicted = predict(config)
        meta["trainwise_device"] = predicted.get("device_name", meta["trainwise_device"])
        measured = measure(config, baseline_used)
        row = {"name": config.name, "model": config.model, "task": config.task, "knobs": config.knobs,
               "predicted": predicted, "measured": measured,
               "error_pct": {key: error_pct(predicted.get(key), measured.get(key))
                             for key in ("peak_allocated", "peak_reserved", "device_total")}}
        rows.append(row)
        print(json.dumps({"row": index, "of": len(configs), **row}), flush=True)
        # After every row: a launch stopped by a time limit keeps what it measured.
        launch = {"provenance": provenance.finish(prov), "meta": meta, "rows": rows}
        atomic_write_text(rows_file, json.dumps(launch, indent=1) + "\n")
    out = args.out or REPO / "docs" / "results" / f"memory-{_slug(meta['gpu'])}.md"
    render = provenance.script_command("render_memory.py", [str(rows_file), "--out", str(out)])
    atomic_write_text(out, render_page([{**launch, "path": str(rows_file)}], render))
    summary = summarize(rows)["peak_allocated"]
    if summary["n"]:
        print(f"peak allocated |error|: median {summary['median']:.1f} %, max {summary['max']:.1f} % "
              f"over {summary['n']} rows; wrote {rows_file} and {out}")
    else:
        print(f"no row measured; wrote {rows_file} and {out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
