"""The public Python API: `trainwise.api.estimate(...)`, `trainwise.api.train(...)`.

`train` is imported on first use: it pulls in the engine, which `estimate` never needs."""

from trainwise.api.estimate import EstimateResult, estimate


def __getattr__(name):
    if name in ("train", "TrainResult"):
        from trainwise.api import training as module

        return getattr(module, name)
    raise AttributeError(f"module 'trainwise.api' has no attribute {name!r}")


__all__ = ["estimate", "EstimateResult", "train", "TrainResult"]
