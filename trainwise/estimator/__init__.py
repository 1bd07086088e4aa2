"""The estimate: how a training step's memory is predicted from its trace.

    predict.py            one device: trace the step (a few blocks of a deep model), read its memory
    layout_estimate.py    a parallel layout: rank 0's memory and every pipeline rank's
    per_rank.py           one rank's model states and communication buffers
    extrapolate.py        the full-depth timeline from the 2- and 3-block traces
    memory.py             a StepTrace on a Device -> the figures users see (MemoryEstimate)
    anatomy.py            the replayed timeline: the peak and what is alive at it
    caching_allocator.py  what allocated memory becomes in the CUDA caching allocator
    result.py             EstimateResult and its JSON
    step_work.py          the step's op table at full depth, before a device profile prices it
    trace_cache.py        a catalog model's one-device estimate kept on disk per request
"""
