"""Issue 23: checkpoints and the undo log share one memory budget; `delete checkpoint N`;
`info checkpoints` shows what each holds."""
from __future__ import annotations

import pytest

from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.errors import FirError
from firscope.runtime import load_model


def _session(random_model, budget: int):
    s = Session(load_model(random_model), [1, 2, 3], 3, engine="interp",
                history_budget=budget)
    return s, CommandInterpreter(s)


def _held(s, ci) -> int:
    """What the history and the checkpoints hold, counting each record once."""
    records = {id(r): r.nbytes for r in s.history.records}
    copies = 0
    for ck in ci.checkpoints:
        copies += ck.nbytes
        records.update({id(r): r.nbytes for r in ck.records})
    return copies + sum(records.values())


def test_checkpoints_and_the_undo_log_stay_within_one_budget(random_model):
    probe, pci = _session(random_model, 512 << 20)
    one = pci.checkpoints.save(probe)[0].nbytes  # what one checkpoint copies here
    budget = 4 * one + (64 << 10)
    s, ci = _session(random_model, budget)
    answers = []
    for _ in range(12):
        ci.execute("next")
        answers.append(ci.execute("checkpoint"))
        assert _held(s, ci) <= budget, (len(ci.checkpoints), _held(s, ci), budget)
    assert 1 <= len(ci.checkpoints) <= 5  # about 4 fit, each with its copies
    assert any("dropped checkpoint 1" in a for a in answers), answers
    kept = [c.number for c in ci.checkpoints]
    assert kept == sorted(kept) and kept[-1] == 12, "the oldest go first"
    ci.execute(f"restart {kept[0]}")  # a kept one still works
    assert _held(s, ci) <= budget


def test_a_checkpoint_larger_than_the_whole_budget_is_refused(random_model):
    s, ci = _session(random_model, 4096)
    with pytest.raises(FirError, match="more than the whole 0.0 MiB history budget; not taken"):
        ci.execute("checkpoint")
    assert len(ci.checkpoints) == 0


def test_delete_checkpoint_and_info_checkpoints(random_model):
    s, ci = _session(random_model, 512 << 20)
    ci.execute("checkpoint")
    ci.execute("next")
    ci.execute("checkpoint")
    info = ci.execute("info checkpoints")
    assert "1   " in info and "2   " in info and "MiB copies +" in info
    assert "undo records" in info and "checkpoints hold" in info and "512.0 MiB" in info
    assert ci.execute("delete checkpoint 1") == "Deleted checkpoint 1."
    assert [c.number for c in ci.checkpoints] == [2]
    with pytest.raises(FirError, match="no checkpoint number 1"):
        ci.execute("restart 1")
    with pytest.raises(FirError, match="no checkpoint number 7"):
        ci.execute("delete checkpoint 2 7")
    assert [c.number for c in ci.checkpoints] == [2], "nothing deleted when one is unknown"
    assert ci.execute("delete checkpoint") == "Deleted checkpoint 2."
    assert ci.execute("info checkpoints") == "No checkpoints."
    assert s.history.budget == 512 << 20, "the log gets the whole budget back"
