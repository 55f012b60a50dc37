"""The GPU tests' shared pieces: the device (or a skip that says why), one kernel on the
GPU and on the reference, ULP distances."""
from __future__ import annotations

import numpy as np
import pytest

from firscope.compare.metrics import ulp_distance
from firscope.errors import FirError
from kernel_util import kernel_program
from firscope.vm.interp import Dispatch

_GPU: list = []


def device_or_skip():
    """The wgpu device, or a pytest skip naming what is missing (shown by -ra)."""
    if not _GPU:
        try:
            from firscope.gpu import open_device
            _GPU.append(open_device())
        except FirError as e:
            _GPU.append(str(e))
    if isinstance(_GPU[0], str):
        pytest.skip(f"no GPU for the GPU engine's tests: {_GPU[0]}")
    return _GPU[0]


@pytest.fixture(scope="session")
def gpu():
    return device_or_skip()


def both(src: str, inputs: dict, outputs: dict, *, gpu, symbols=None, budget=1_000_000):
    """Run a one-kernel program on the reference and on the GPU from the same arena.
    Returns (reference arena or its FirError, GPU arena or its FirError, regions)."""
    from firscope.gpu.runner import run_program
    sizes = {n: len(v) for n, v in inputs.items()}
    sizes.update(outputs)
    program, arena, regions = kernel_program(src, sizes, symbols)
    for n, v in inputs.items():
        arena[regions[n].base: regions[n].base + regions[n].size] = v
    start = arena.copy()
    ref = arena.copy()
    try:
        with np.errstate(all="ignore"):
            Dispatch(program, ref).run(budget)
    except FirError as e:
        ref = e
    try:
        got = run_program(program, start, gpu=gpu, budget=budget)
    except FirError as e:
        got = e
    return ref, got, regions


def max_ulp(a: np.ndarray, b: np.ndarray) -> int:
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    d = ulp_distance(a, b)
    d[both_nan] = 0
    return int(d.max()) if d.size else 0
