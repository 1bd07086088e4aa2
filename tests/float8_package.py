"""torchao for the float8 tests.

torchao is kept out of the test virtualenv: installed there, transformers imports it in
every process (0.9 s and warnings about its CUDA-only libraries on a CPU build). `make test`
runs the tests marked `float8` in a second pass with torchao on PYTHONPATH and
TRAINWISE_FLOAT8_PASS=1; in that pass a missing torchao fails the test instead of skipping
it, so the float8 estimate cannot go unchecked. Elsewhere they skip without torchao.
"""

import os

import pytest

PASS_VARIABLE = "TRAINWISE_FLOAT8_PASS"


def needs_torchao() -> None:
    """Skip without torchao, except in the float8 pass, where its absence is an error."""
    if os.environ.get(PASS_VARIABLE):
        import torchao.float8  # noqa: F401  (ImportError: the pass that runs them could not)
        return
    pytest.importorskip("torchao.float8")
