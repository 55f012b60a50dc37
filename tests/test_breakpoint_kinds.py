"""New breakpoint kinds plug into the stepping core without touching it (issues 13, 15).

A NodeCheck decides after each node completes (``break diverge``); an
InstructionCheck watches a dispatch instruction by instruction (``break race``).
Both go through the common hit rule and stop with the breakpoint's number.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from firscope.debug.breakpoints import InstructionCheck, NodeCheck
from firscope.debug.commands import CommandInterpreter
from firscope.debug.session import Session
from firscope.debug.snapshot import StopReason
from firscope.runtime import load_model
from firscope.vm.interp import Observer


@dataclass(frozen=True, kw_only=True)
class BigResidual(NodeCheck):
    limit: float

    def fired(self, session, node):
        if any(o.name == "x" for o in node.outs):
            m = float(np.abs(session.buffer_value("x")).max())
            if m > self.limit:
                return f"max|x| = {m:.3g} after {node.full_name}"
        return None


class _FirstMul(Observer):
    wants_after = True
    lane = 2

    def after(self, d, op):
        if op.text.startswith("mul "):
            self.message = f"mul at line {op.loc.line}"
            return True
        return False


@dataclass(frozen=True, kw_only=True)
class StopAtMul(InstructionCheck):
    def wants(self, session, node):
        return node.target == "g2.gelu_new"

    def observer(self, session, node):
        return _FirstMul()


def test_node_and_instruction_kinds_stop_through_the_table(random_model):
    m = load_model(random_model)
    s = Session(m, [1, 2], 2, engine="compiled")
    ci = CommandInterpreter(s)
    limit = 0.5
    bp = s.breakpoints.add(BigResidual(spec=f"max|x| > {limit}", limit=limit))
    stop = s.cont()
    assert stop.reason is StopReason.BREAKPOINT and stop.breakpoint == bp.number
    assert stop.message.startswith(f"Catchpoint {bp.number}, max|x| = ")
    assert float(np.abs(s.buffer_value("x")).max()) > limit
    s.breakpoints.delete([bp.number])
    mul = s.breakpoints.add(StopAtMul(spec="first mul in gelu"))
    ci.execute("continue")
    stop = ci.last.stop
    assert stop.breakpoint == mul.number and "mul at line" in stop.message
    assert s.dispatch is not None and s.dispatch.ops[s.dispatch.pc - 1].text.startswith("mul ")
    assert ci.lane == 2  # the kind named the lane to look at
    s.breakpoints.update(mul.number, ignore_count=1)
    ci.execute("continue")  # the next gelu's first mul is ignored, the one after stops
    assert s.breakpoints.get(mul.number).hit_count == 3


def test_counts_stay_right_when_a_breakpoint_is_hit_many_times_in_one_run(random_model):
    """A line inside a loop: ignore 5, then stop; the counts are the table's, not a copy's."""
    m = load_model(random_model)
    s = Session(m, [1], 1, engine="interp")
    bp = s.add_breakpoint("g2.layernorm:90")
    s.set_ignore(bp.number, 5)
    stop = s.cont()
    assert stop.breakpoint == bp.number
    assert s.breakpoints.get(bp.number).hit_count == 6
    assert s.breakpoints.get(bp.number).ignore_count == 0


def test_a_node_named_token_is_a_node_breakpoint_and_token_n_still_a_token_one(random_model):
    # the seed's first node is called 'token': F9 on it in the UI sent `break token`, which
    # was read as an incomplete `break token N`
    from firscope.debug.breakpoints import NodeBreakpoint, TokenBreakpoint, parse_location
    from firscope.errors import FirError
    m = load_model(random_model)
    assert any(n.name == "token" for n in m.nodes)
    bp = parse_location(m, "token")
    assert isinstance(bp, NodeBreakpoint) and bp.node == "token"
    assert isinstance(parse_location(m, "token 3"), TokenBreakpoint)
    assert parse_location(m, "token 3").token == 3
    s = Session(m, [1, 2], 2, engine="compiled")
    ci = CommandInterpreter(s)
    ci.execute("break token")
    ci.execute("continue")
    assert ci.last.stop.reason is StopReason.BREAKPOINT and s.location().node == "token"
    with pytest.raises(FirError, match="expected 'token N'"):
        parse_location(m, "token x")
