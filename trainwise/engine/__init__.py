"""The engine: turns a Plan into a running training job on real tensors.

Folders and files, each one concept:
    run_config.py   RunConfig: data, steps, outputs, seed (everything that is not a knob)
    data/           training data: synthetic, the built-in corpus, local files; resumable order
    checkpoint.py   atomic save / resume of model, optimizer, scheduler, scaler, RNG, data position
    flops.py        MFU against the catalog peak (the FLOPs are counted in trace/flops.py)
    memory_probe.py measured peak memory (CUDA allocator + NVML, or CPU tensor memory)
    metrics.py      throughput / MFU bookkeeping and the JSON-lines metrics file
    setup.py        apply(plan, model): the techniques in their documented order
    loop.py         the training loop: accumulation, loss scaling, clipping, NaN handling
"""
