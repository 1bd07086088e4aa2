#!/usr/bin/env bash
# Every GPU validation the issues ask for, on a machine with one CUDA GPU:
#
#   bash benchmarks/gpu_validation.sh DIR STAGE...
#
# STAGE: smoke | memory | vs-trainer | offload | bench | profile | time-model | plan | activation-offload |
# engine-speed | engine-fit | engine-memory | tasks | tp-compile. Each stage has its own time limit
# (seconds, env LIMIT_<STAGE>) so a slow one cannot starve the rest; each writes its log
# and results under DIR, and its scripts write their rows as they go, so a stage stopped by
# its limit keeps what it measured. The limits of one STAGE add up to at most 9 minutes
# (DRY_RUN=1 prints each command and its limit without running it), so a stage fits a
# 10-minute command on a GPU lent for 15 minutes; several stages in one launch run in order.
# Uses the python3 on PATH (set PYTHON to choose another); runs from a checkout without
# installing it (PYTHONPATH), so a machine without package registries works if torch,
# transformers, peft, rich, pyyaml and nvidia-ml-py are there; WHEELS=FOLDER first installs
# the wheels in FOLDER (e.g. those `python benchmarks/gpu_wheels.py FOLDER` downloads for the
# gpu extra) into DIR/site, offline, and puts them on the path.
#
# Results pages are rendered from what a stage writes, never edited by hand: commit
# DIR/memory-rows.json as docs/results/rows/memory-<gpu>-<n>.json and run
# `python benchmarks/render_memory.py docs/results/rows/memory-<gpu>-*.json --out docs/results/memory-<gpu>.md`
# (launches merge, the newest row of a configuration wins); DIR/offload/results.md and
# the vs-trainer rows files carry their provenance the same way; the engine-speed rows file is
# committed as docs/results/rows/engine-speed-<gpu>-<n>.json and rendered by
# `python benchmarks/render_engine_speed.py docs/results/rows/engine-speed-<gpu>-*.json --out docs/results/engine-speed-<gpu>.md`.
set -u
out=${1:?usage: gpu_validation.sh DIR STAGE...}
shift
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ] && [ -z "${DRY_RUN:-}" ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$out/site" "$WHEELS"/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:$out/site"  # after the checkout and the image's own packages' path
fi

stage() {  # stage NAME LIMIT COMMAND...: run with a limit, log to DIR/NAME.log, say how it ended
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  echo "=== $name (limit ${limit} s): $(printf '%q ' "$@")"  # quoted as a shell would read it
  [ -n "${DRY_RUN:-}" ] && return 0
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - started)) s"
  tail -n 5 "$out/$name.log"
}

for name in "$@"; do
  case $name in
    smoke)
      stage versions 60 $py -c "import torch, transformers, peft, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'python', platform.python_version(), torch.cuda.get_device_name(0))"
      stage env 60 $py -m trainwise env
      stage smoke-train "${LIMIT_SMOKE:-120}" $py -m trainwise train tiny-llama --device cuda --precision bf16 --steps 5 --data synthetic --out "$out/smoke-run"
      ;;
    memory)
      stage memory "${LIMIT_MEMORY:-330}" $py benchmarks/validate_memory.py --out "$out/memory.md" --rows "$out/memory-rows.json" ${MEMORY_ONLY:+--only "$MEMORY_ONLY"}
      ;;
    vs-trainer)
      stage vs-trainer-bert-large "${LIMIT_VS_BERT:-120}" $py benchmarks/vs_hf_trainer.py --case bert-large --repeats 2 --steps 30 --rows "$out/vs-trainer-rows.json"
      stage vs-trainer-llama-1b "${LIMIT_VS_LLAMA:-170}" $py benchmarks/vs_hf_trainer.py --case llama-1b --repeats 2 --steps 20 --rows "$out/vs-trainer-rows.json"
      ;;
    offload)
      stage offload "${LIMIT_OFFLOAD:-300}" $py benchmarks/scaling.py --offload-demo --out "$out/offload" --timeout 280 --debug
      ;;
    bench)
      stage bench "${LIMIT_BENCH:-330}" $py -m trainwise bench --out "$out/bench"
      ;;
    profile)  # issue 26 item 5: the complete GPU profile (fp8 matmuls, copies both ways, the CUDA context, compiled host times)
      stage profile "${LIMIT_PROFILE:-330}" $py -m trainwise calibrate --device cuda --out "$out/profile-cuda.json" --json
      stage profile-test "${LIMIT_PROFILE_TEST:-150}" $py -m pytest -o addopts="" -q -m gpu tests/test_gpu_profile.py
      ;;
    time-model)  # issue 16: predicted vs measured step time (calibrate first), MAPE and Spearman
      stage time-model "${LIMIT_TIME_MODEL:-420}" $py benchmarks/time_model.py --device cuda --repeat 2 --steps 12 --warmup 3 --models "${TIME_MODELS:-bert-large-uncased,Llama-3.2-1B}" --seq-lens "${TIME_SEQ_LENS:-512,2048}" --page "$out/time-model-cuda.md"
      ;;
    activation-offload)  # issue 17 item 5: predicted vs measured peak with the blocks' saved tensors on the host, and the step time beside plain
      stage activation-offload-memory "${LIMIT_ACT_OFFLOAD:-240}" $py benchmarks/validate_memory.py --out "$out/activation-offload.md" --rows "$out/activation-offload-rows.json" --only "llama-1b b4 bf16( ckpt)?( act-offload)?$"
      stage activation-offload-bench "${LIMIT_ACT_OFFLOAD_BENCH:-240}" $py -m trainwise bench Llama-3.2-1B --seq-len 2048 --steps 12 --baseline none --ladder "$repo/benchmarks/activation_offload_ladder.yaml" --out "$out/activation-offload-bench"
      ;;
    plan)  # issue 16: the plan search's pick for Llama-3.2-1B at seq 2048, its top 3 run for real
      stage plan-verify "${LIMIT_PLAN:-420}" $py -m trainwise plan Llama-3.2-1B --device cuda --seq-len 2048 --global-batch 64 --verify 3 --json --out "$out/plans"
      ;;
    engine-speed)  # issue 17: the fastest plan vs the Trainer's hand configuration, each side at its largest batch
      # Needs the gpu extra (liger-kernel, torchao). Each side's batch search starts where the
      # estimate says it fits (two short runs per side, usually), then 2 timed runs per side.
      stage engine-speed-llama-1b "${LIMIT_ENGINE_LLAMA:-320}" $py benchmarks/engine_speed.py Llama-3.2-1B --seq-len 2048 --precision bf16 --optim adamw-fused --attention sdpa --kernels liger --float8 --compile --loss fused --start predicted --batch-sizes 4,8,16,32 --steps 12 --repeats 2 --timeout 150 --rows "$out/engine-speed-rows.json"
      stage engine-speed-bert-large "${LIMIT_ENGINE_BERT:-200}" $py benchmarks/engine_speed.py bert-large-uncased --task seq-cls --seq-len 512 --precision bf16 --optim adamw-fused --attention sdpa --float8 --compile --start predicted --batch-sizes 16,32,64,128 --steps 20 --repeats 2 --timeout 100 --rows "$out/engine-speed-rows.json"
      ;;
    engine-fit)  # issue 17: the largest batch of Llama-3.1-8B at 4096 tokens on one GPU, three ways
      # Predicted on an 80 GB H100 (trainwise estimate, adamw-8bit, bf16-pure): full checkpointing
      # fits 4, with the fused loss 8; the fused loss with selective checkpointing only 2 (it
      # keeps every block's matmul outputs, more than the logits it saves). Needs bitsandbytes.
      stage fit-llama-8b-plain "${LIMIT_FIT_8B:-170}" $py benchmarks/engine_speed.py Llama-3.1-8B --fit-only --start predicted --seq-len 4096 --precision bf16-pure --optim adamw-8bit --grad-ckpt --batch-sizes 1,2,4,8,16 --timeout 80 --rows "$out/engine-fit-rows.json"
      stage fit-llama-8b-fused "${LIMIT_FIT_8B:-170}" $py benchmarks/engine_speed.py Llama-3.1-8B --fit-only --start predicted --seq-len 4096 --precision bf16-pure --optim adamw-8bit --loss fused --grad-ckpt --batch-sizes 1,2,4,8,16 --timeout 80 --rows "$out/engine-fit-rows.json"
      stage fit-llama-8b-fused-selective "${LIMIT_FIT_8B:-170}" $py benchmarks/engine_speed.py Llama-3.1-8B --fit-only --start predicted --seq-len 4096 --precision bf16-pure --optim adamw-8bit --loss fused --grad-ckpt --grad-ckpt-policy selective --batch-sizes 1,2,4,8,16 --timeout 80 --rows "$out/engine-fit-rows.json"
      ;;
    engine-memory)  # issue 17: each new knob's predicted peak vs max_memory_allocated (Llama-3.2-1B rows; the liger rows from the traced stand-in)
      stage memory-new-knobs "${LIMIT_MEMORY_KNOBS:-520}" $py benchmarks/validate_memory.py --only 'liger|float8|fused|selective|every 2|act-offload|packed' --out "$out/memory-new-knobs.md" --rows "$out/memory-new-knobs-rows.json"
      ;;
    tasks)  # issue 18: predicted vs measured peak for ViT, Swin, ConvNeXt, Whisper, Wav2Vec2 and LLaVA-1.5-7B
      stage memory-tasks "${LIMIT_TASKS:-300}" $py benchmarks/validate_memory.py --only 'vit|swin|convnext|whisper|wav2vec2|llava' --out "$out/memory-tasks.md" --rows "$out/memory-tasks-rows.json"
      ;;
    tp-compile)  # issue 25 item 2: per-block compile and float8 styles over DTensor blocks, on the 1-rank tp mesh one GPU allows (no cross-rank traffic, nothing timed)
      stage tp-compile "${LIMIT_TP_COMPILE:-300}" $py -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/tp_compile_check.py --out "$out/tp-compile.json"
      ;;
    *)
      echo "unknown stage $name (smoke, memory, vs-trainer, offload, bench, profile, time-model, plan, activation-offload, engine-speed, engine-fit, engine-memory, tasks, tp-compile)" >&2
      exit 2
      ;;
  esac
done
