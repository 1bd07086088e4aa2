"""The op table of a traced step: every op's work added up by kind, what the step-time model
reads (trainwise/estimator/step_time.py). Plain data without torch: trainwise/trace/op_costs.py
fills it while the step is traced, and the trace cache (trainwise/estimator/trace_cache.py)
reads it back, where no torch is imported.

One row per (phase, micro-step, op class, dtype name, recomputed?, head dim) holds (ops,
FLOPs, bytes read, bytes written). Rows, not a list of ops, keep the memory of a trace of a
deep model small; the time of an op depends only on its class, dtype and size (and an
attention kernel's on its head dim), and the step-time model is linear in those sums."""

from __future__ import annotations

from dataclasses import dataclass, field

# The op classes, as trainwise/trace/op_costs.py decides them (its docstring says which op is which).
CLASSES = ("matmul", "attention", "normalization", "transcendental", "random", "elementwise", "metadata")


@dataclass
class OpCosts:
    """Totals of a traced step's ops: `rows[(phase, micro_step, op class, dtype, recomputed,
    head dim)]` = [ops, FLOPs, bytes read, bytes written]. `micro_step` is 0 for the first
    micro-step and 1 for the second (the trace runs at most two; later ones repeat the
    second), 0 outside forward/backward/data. `head dim` is an attention kernel's (the last
    dimension of its query), 0 for every other op."""

    rows: dict[tuple[str, int, str, str, bool, int], list[int]] = field(default_factory=dict)
    # Under --compile, the work of the compiled regions as inductor launches it, same keys
    # and columns with ops counting launched kernels (trainwise/trace/fusion.py); the ops
    # run eager stay in `rows`. Empty for an eager step.
    compiled: dict[tuple[str, int, str, str, bool, int], list[int]] = field(default_factory=dict)

    def total(self, index: int, **match) -> int:
        """Sum of column `index` (0 ops, 1 FLOPs, 2 read, 3 written) over rows whose key
        fields equal `match` (phase=, micro_step=, op_class=, dtype=, recomputed=, head_dim=)."""
        return sum(values[index] for key, values in self.rows.items() if _matches(key, match))

    def compiled_total(self, index: int, **match) -> int:
        """As `total`, over the compiled regions' rows."""
        return sum(values[index] for key, values in self.compiled.items() if _matches(key, match))


_FIELDS = ("phase", "micro_step", "op_class", "dtype", "recomputed", "head_dim")


def _matches(key: tuple, match: dict) -> bool:
    return all(key[_FIELDS.index(name)] == value for name, value in match.items())
