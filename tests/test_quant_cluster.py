"""eval and quant sensitivity on a Dask distributed cluster (issue 42 item 5): a local
cluster of two worker processes gives the same figures bit for bit as one process; a
scheduler that does not answer, workers that see other files and a sensitivity worker that
finds no replay records are each handled in words (or by the slower, equal path)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REPO, SAMPLE
from model_util import firscope

distributed = pytest.importorskip(
    "distributed", reason="Dask's distributed is not installed (pip install 'firscope[cluster]')")

from firscope.errors import FirError  # noqa: E402
from firscope.jitcache import cache_dir  # noqa: E402
from firscope.quant import cluster as cl  # noqa: E402
from firscope.quant.work import Setup, Task, _bank, run_task  # noqa: E402

CORPUS = REPO / "tests" / "data" / "corpus_json_decoder.txt"


@pytest.fixture(scope="module")
def local_cluster():
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                 dashboard_address=None)
    try:
        yield c.scheduler_address
    finally:
        c.close()


def _run_fresh(*args) -> dict:
    """``firscope ARGS --json``, the f32 logits and replay records it cached removed after
    it, so the next run computes its own."""
    folder = cache_dir("eval")
    before = set(folder.iterdir())
    try:
        # a process of its own: a command keeps its cluster connections until it exits
        r = firscope(*args, "--json", timeout=600, fresh=True)
    finally:
        for p in set(folder.iterdir()) - before:
            p.unlink(missing_ok=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_eval_on_a_two_worker_cluster_gives_the_same_bits(local_cluster):
    args = ("eval", "--corpus", CORPUS, "--ctx", 48, "--chunks", 4)
    here = _run_fresh(*args, "--workers", 0)
    there = _run_fresh(*args, "--cluster", local_cluster)
    assert here["summary"] == there["summary"]
    assert here["per_chunk"] == there["per_chunk"]
    assert len(there["per_chunk"]) == 4


def test_sensitivity_on_a_two_worker_cluster_gives_the_same_bits(local_cluster):
    args = ("quant", "sensitivity", "--corpus", CORPUS, "--ctx", 32, "--chunks", 2)
    here = _run_fresh(*args, "--workers", 0)
    there = _run_fresh(*args, "--cluster", local_cluster)
    assert here["weights"] == there["weights"] and here["all_q4"] == there["all_q4"]
    assert there["replayed_layers"] == here["replayed_layers"] != []


def test_a_replay_without_its_records_runs_the_variant_in_full_with_the_same_figures(tmp_path):
    """A cluster worker that does not share firscope's cache folder finds no records."""
    setup = Setup(str(SAMPLE / "gpt2.fir"), 32, "compiled")
    bank = _bank(setup)
    name = bank.instances[len(bank.instances) // 2]
    choice = tuple(sorted({**bank.all_f32(), name: bank.q4_form(name)}.items()))
    tokens = (np.arange(24, dtype=np.int64) * 7) % bank.model.vocab
    full = run_task(setup, Task(0, 0, tokens, 1, (choice,), None))
    missing = run_task(setup, Task(0, 0, tokens, 1, (choice,), None, replay="replay",
                                   snapshots=(("f32", str(tmp_path / "absent.npz")),),
                                   origins=("f32",), verified=tuple(range(bank.model.layers))))
    assert np.array_equal(full.stats[0].kld, missing.stats[0].kld)
    assert np.array_equal(full.stats[0].nll, missing.stats[0].nll)


@pytest.mark.parametrize("address, why", [("nonsense", "missing port number"),
                                           ("tcp://localhost:99999", "outside 1..65535")])
def test_a_malformed_address_is_refused_before_connecting(address, why):
    with pytest.raises(FirError, match=f"--cluster {address}: not a scheduler address .*{why}"):
        cl.ClusterPool(address, Setup(str(SAMPLE / "gpt2.fir"), 32, "compiled"))


def test_a_scheduler_that_does_not_answer_is_named(monkeypatch):
    monkeypatch.setattr(cl, "CONNECT_SECONDS", 1)
    with pytest.raises(FirError, match=r"--cluster tcp://127\.0\.0\.1:9: no Dask scheduler "
                                       r"answered there within 1 s"):
        cl.ClusterPool("tcp://127.0.0.1:9", Setup(str(SAMPLE / "gpt2.fir"), 32, "compiled"))


class _Client:
    def __init__(self, answers):
        self.answers = answers
        self.closed = False

    def scheduler_info(self, n_workers=-1):
        return {"workers": {w: {} for w in self.answers}}

    def run(self, fn, *args):
        return self.answers

    def close(self):
        self.closed = True


def _pool_with(answers) -> cl.ClusterPool:
    pool = cl.ClusterPool.__new__(cl.ClusterPool)
    pool.address, pool.setup = "tcp://sched:8786", Setup(str(SAMPLE / "gpt2.fir"), 32, "compiled")
    pool.client = _Client(answers)
    return pool


def test_workers_that_see_other_files_or_none_are_refused_by_name():
    mine = cl._fingerprint(str(SAMPLE / "gpt2.fir"))
    _pool_with({"tcp://a:1": mine, "tcp://b:2": mine})._check()  # the same files: accepted
    other = {**mine, "model.safetensors": "0" * 16}
    with pytest.raises(FirError, match=r"worker tcp://b:2 has another model\.safetensors "
                                       r"contents"):
        _pool_with({"tcp://a:1": mine, "tcp://b:2": other})._check()
    with pytest.raises(FirError, match=r"worker tcp://a:1 cannot read the model at .*"
                                       r"FileNotFoundError"):
        _pool_with({"tcp://a:1": "FileNotFoundError: no such file"})._check()
    with pytest.raises(FirError, match="the scheduler has no workers"):
        _pool_with({})._check()
    with pytest.raises(FirError, match="another firscope version"):
        _pool_with({"tcp://a:1": {**mine, "firscope": "0.0.0"}})._check()


def test_a_cluster_address_with_spaces_is_a_usage_error():
    r = firscope("eval", "--corpus", CORPUS, "--cluster", "tcp://a b:1")
    assert r.returncode == 2 and "not a scheduler address" in r.stderr
