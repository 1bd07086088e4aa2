"""Rate: how long an op of a given size takes on a device (a fixed cost plus the size over
a throughput), and how a profile's rates are read where it measured none exactly: between
the head dims attention was timed at, or for a dtype it has no rate for."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """An op of size x takes fixed_s + x / per_s seconds."""

    per_s: float
    fixed_s: float = 0.0

    def seconds(self, amount: float) -> float:
        return self.fixed_s + amount / self.per_s if amount > 0 else 0.0

    def to_json(self) -> dict:
        return {"per_s": self.per_s, "fixed_s": self.fixed_s}

    @classmethod
    def from_json(cls, data: dict) -> "Rate":
        return cls(float(data["per_s"]), float(data.get("fixed_s", 0.0)))


def stand_in_dtype(dtype: str, measured) -> str:
    """The dtype whose rate prices `dtype` where a profile has none (`measured`: its dtypes)."""
    return "bf16" if dtype == "fp8" and "bf16" in measured else "fp32"


def rate_at_head_dim(rates: dict[int, Rate], head_dim: int) -> Rate:
    """The Rate at `head_dim` from rates measured at some head dims: each term read on the
    line between the two measured head dims around it, in log head dim (the dims measured
    double from one to the next); outside them, the nearest one's (a kernel's rate beyond
    the dims it was timed at is not known to keep changing)."""
    dims = sorted(rates)
    if head_dim in rates:
        return rates[head_dim]
    if head_dim < dims[0]:
        return rates[dims[0]]
    if head_dim > dims[-1]:
        return rates[dims[-1]]
    upper = next(dim for dim in dims if dim > head_dim)
    lower = dims[dims.index(upper) - 1]
    share = math.log(head_dim / lower) / math.log(upper / lower)
    low, high = rates[lower], rates[upper]
    return Rate(low.per_s + share * (high.per_s - low.per_s), low.fixed_s + share * (high.fixed_s - low.fixed_s))
