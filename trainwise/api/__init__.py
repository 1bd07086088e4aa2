"""The public Python API: `trainwise.api.estimate(...)`."""

from trainwise.api.estimate import EstimateResult, estimate

__all__ = ["estimate", "EstimateResult"]
