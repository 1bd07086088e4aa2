"""trainwise: predict, plan, train and measure transformer training configurations.

    import trainwise
    trainwise.estimate("Llama-3.1-8B", trainwise.Plan(precision="bf16", grad_ckpt=True))
    trainwise.train("tiny-llama", plan=trainwise.Plan(device="cpu", seq_len=128),
                    run=trainwise.RunConfig(steps=20))

The API is imported lazily, so `import trainwise` stays cheap (no torch import).
"""

__version__ = "0.1.0"

_LAZY = {
    "estimate": ("trainwise.api.estimate", "estimate"),
    "train": ("trainwise.api.training", "train"),
    "Plan": ("trainwise.plan.plan", "Plan"),
    "RunConfig": ("trainwise.engine.run_config", "RunConfig"),
}


from trainwise.common.lazy import lazy_attributes  # noqa: E402

__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = list(_LAZY)
