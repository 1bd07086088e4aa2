"""The engine: turns a Plan into a running training job on real tensors.

Folders and files, each one concept:
    run_config.py   RunConfig: data, steps, outputs, seed (everything that is not a knob)
    data/           training data: synthetic, the built-in corpus, local files; resumable order
    checkpoint.py   atomic save / resume of model, optimizer, scheduler, scaler, RNG, data position
    flops.py        MFU against the catalog peak (the FLOPs are counted in trace/flops.py)
    memory_probe.py measured peak memory (CUDA allocator + NVML, or CPU tensor memory)
    metrics.py      throughput / MFU bookkeeping and the JSON-lines metrics file
    parallelize.py  parallelize(model, plan): every technique in its one documented order
    setup.py        TrainingSetup: what the loop runs
    parallel/       the layouts: mesh, tensor/pipeline/data parallel, FSDP2, --classic
    train_step.py   one optimizer step: accumulation, loss scaling, clipping, NaN handling
    run.py          the run: steps, logging, evaluation, checkpoints, the summary
    job.py          a training job from request to result (what trainwise.api.train runs)
"""
