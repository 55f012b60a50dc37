"""Shared fixtures: the bundled sample model and small random GPT-2 checkpoints."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_models" / "tiny-gpt2"
SEED_FIR = SAMPLE / "gpt2.fir"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _private_caches() -> None:
    """Tests never read or write the user's ~/.cache/firscope: compiled kernels and numba's
    cache go to a folder of this test run (cold, as CI is). FIRSCOPE_TEST_CACHE=DIR keeps
    one folder across runs instead, for quick local iteration. pytest-xdist's workers
    share the folder of the process that started them (FIRSCOPE_TEST_RUN_CACHE, which
    removes it at exit): each kernel is compiled once per run, not once per worker (numba
    and firscope/vm/kernel_cache write their files atomically, for processes sharing a
    cache)."""
    import os
    import tempfile
    keep = os.environ.get("FIRSCOPE_TEST_CACHE") or os.environ.get("FIRSCOPE_TEST_RUN_CACHE")
    if keep:
        folder = Path(keep)
    else:
        import atexit
        folder = Path(tempfile.mkdtemp(prefix="firscope-test-cache-"))
        os.environ["FIRSCOPE_TEST_RUN_CACHE"] = str(folder)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(folder)
    # Where PYTHONDONTWRITEBYTECODE is set (as on the machines CI runs on), every process
    # the tests start (a few hundred: the command line, DAP servers, probes, pytest-xdist's
    # workers) compiled firscope's ~200 modules from source again (an editable install:
    # ~0.15 s each). It is dropped for the processes the tests start: the first writes the
    # bytecode (__pycache__, ignored by git), the others read it. (PYTHONPYCACHEPREFIX
    # instead would have every process look for all bytecode there, the venv's included.)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    from firscope.jitcache import numerics_stamp  # a kept folder must not serve old numerics
    os.environ["NUMBA_CACHE_DIR"] = str(folder / f"numba-{numerics_stamp()}")


_private_caches()


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """One full garbage collection, then the survivors frozen, before pytest's own five
    (_pytest/unraisableexception.gc_collect_harder): a worker of the whole suite holds
    ~10^6 objects (numba, Textual, torch), five collections of them took more than the 5 s
    execnet gives a pytest-xdist worker to finish once it is told to, and execnet then
    sends it SIGINT, which landed in a collection (hypothesis's gc callback: "Exception
    ignored ... KeyboardInterrupt" at the end of every parallel run). The garbage is still
    collected, with pytest's unraisable-exception hook in place to report what its
    finalizers raise."""
    import gc
    gc.collect()
    gc.freeze()


class Lazy:
    """A module imported when a test first uses it (pytest.importorskip: that test is
    skipped, saying why, where it is not installed), not when the test file is imported:
    every pytest-xdist worker imports every test file, and torch with transformers takes
    ~3 s of each worker's collection."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # pytest's collection asks every module-level name for
            raise AttributeError(attr)  # __test__ and the like: no import for those
        return getattr(pytest.importorskip(self._name), attr)


def write_random_gpt2(folder: Path, *, n_layer=2, n_embd=64, n_head=4, n_positions=32,
                      vocab=256, prefix="transformer.", seed=0, fir_text=None,
                      config_extra=None) -> Path:
    """A randomly initialised GPT-2 in HF's safetensors layout, made with NumPy only."""
    from safetensors.numpy import save_file
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    E = n_embd

    def r(*shape, s=0.1):
        return rng.normal(0, s, shape).astype(np.float32)

    t = {"wte.weight": r(vocab, E, s=0.05), "wpe.weight": r(n_positions, E, s=0.02)}
    for i in range(n_layer):
        p = f"h.{i}."
        t[p + "ln_1.weight"] = 1 + r(E)
        t[p + "ln_1.bias"] = r(E)
        t[p + "attn.c_attn.weight"] = r(E, 3 * E)
        t[p + "attn.c_attn.bias"] = r(3 * E)
        t[p + "attn.c_proj.weight"] = r(E, E)
        t[p + "attn.c_proj.bias"] = r(E)
        t[p + "ln_2.weight"] = 1 + r(E)
        t[p + "ln_2.bias"] = r(E)
        t[p + "mlp.c_fc.weight"] = r(E, 4 * E)
        t[p + "mlp.c_fc.bias"] = r(4 * E)
        t[p + "mlp.c_proj.weight"] = r(4 * E, E)
        t[p + "mlp.c_proj.bias"] = r(E)
    t["ln_f.weight"] = 1 + r(E)
    t["ln_f.bias"] = r(E)
    save_file({prefix + k: v for k, v in t.items()}, str(folder / "model.safetensors"))
    config = dict(model_type="gpt2", n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                  n_positions=n_positions, vocab_size=vocab, layer_norm_epsilon=1e-5,
                  activation_function="gelu_new", scale_attn_weights=True)
    config.update(config_extra or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    fir = folder / "gpt2.fir"
    if fir_text is None:
        shutil.copy(SEED_FIR, fir)
    else:
        fir.write_text(fir_text)
    return fir


@pytest.fixture
def random_model(tmp_path) -> Path:
    """Path to gpt2.fir beside a random 2-layer GPT-2 (n_embd 64, vocab 256)."""
    return write_random_gpt2(tmp_path / "rand")


@pytest.fixture
def make_model(tmp_path):
    """Factory: make_model(name, **kw) -> path of a gpt2.fir beside a random checkpoint."""
    def make(name="m", **kw):
        return write_random_gpt2(tmp_path / name, **kw)
    return make


@pytest.fixture(scope="session")
def sample_fir() -> Path:
    return SEED_FIR
