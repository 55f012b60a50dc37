"""The graph runtime: arena, decode step, generation, and event hooks.

A decode step writes the token id and position into the ``input:``
buffers, runs every node of the unrolled plan in order, and reads
``output:logits``. The pieces of a step (:meth:`Machine.begin_token`,
:meth:`Machine.run_node`, :meth:`Machine.dispatch`,
:meth:`Machine.finish_token`) are public so that the debugger can drive a
step node by node and instruction by instruction on the same arena.

Hooks: a debugger or profiler appends callables to the lists of
:class:`Hooks`. With every list empty the step runs the plain loop, so an
unobserved run pays nothing for them.

The plain loop runs a list made once per (arena, budget, kernel runner, thread
count): per node the function and argument tuple that run it (a linear's
kernel entry with the arena's views and the matrix bound: runtime/extops
``EXT_CALLS``, which saved 4.6-6.4 us of checks and choices per q4 linear on the
2-core Zen 4, a decode step 0.96x; another ext op's implementation; or for a
compiled micro node that always takes the plain driver, the driver's
machine-code entry with its arguments bound: vm/compiled
``CompiledRunner.plain_call``), so a small dispatch costs a call and the stop
flag's check, not a pass through the runner's planning. Nodes timed through
:meth:`Machine.run_node` (a profiler's hooks) take the same calls.
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from ..errors import FirError
from ..fir.syntax import NodeKind
from ..model.numerics import exp64_numpy
from ..model.threads import adapt as adapt_threads, matvec_threads
from ..vm.faults import stopped_before
from ..vm.interp import Dispatch, Observer
from . import gemv
from .extops import EXT_CALLS, EXT_IMPLS
from .load import Model
from .plan import PlanNode

DEFAULT_BUDGET = 50_000_000  # instructions per dispatch before a kernel counts as runaway


class Engine(enum.StrEnum):
    """How micro-kernels run: compiled per-lane code, or the step interpreter (the reference)."""

    COMPILED = "compiled"
    INTERP = "interp"


@dataclass
class Hooks:
    before_node: list[Callable] = field(default_factory=list)  # (machine, node)
    after_node: list[Callable] = field(default_factory=list)  # (machine, node, seconds)
    before_instruction: list[Callable] = field(default_factory=list)  # (dispatch, op)
    after_instruction: list[Callable] = field(default_factory=list)  # (dispatch, op)
    on_dispatch: list[Callable] = field(default_factory=list)  # (machine, node, dispatch)
    # (machine, node) right after the node of that plan index ran, however it ran: a few
    # nodes observed (the Python API's record= and patch=) keep the plain loop for the rest
    at_node: dict[int, list[Callable]] = field(default_factory=dict)

    @property
    def per_node(self) -> bool:
        return bool(self.before_node or self.after_node)

    @property
    def per_instruction(self) -> bool:
        return bool(self.before_instruction or self.after_instruction or self.on_dispatch)


class _HookObserver(Observer):
    """The machine's per-instruction hook lists, seen from the dispatch's one loop."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks
        self.wants_before = bool(hooks.before_instruction)
        self.wants_after = bool(hooks.after_instruction)

    def before(self, d, op) -> bool:
        for h in self.hooks.before_instruction:
            h(d, op)
        return False

    def after(self, d, op) -> bool:
        for h in self.hooks.after_instruction:
            h(d, op)
        return False


@dataclass
class StepResult:
    token: int
    position: int
    logits: np.ndarray


class BoundCall(NamedTuple):
    """One node of the plan bound for the plain loop (:meth:`Machine.bound_calls`):
    ``fn(*args)`` runs it exactly as a step does."""

    node: PlanNode
    fn: Callable | None  # None: the node goes through the general path (Machine.run_node)
    args: tuple | None
    plain: bool  # a compiled micro node on its plain driver: the call returns a status
    # the driver's own machine-code entry (False: the runner's wrapper, which proves the
    # plain path per dispatch, as attention's position, and else runs the checked driver)
    direct: bool = False


class Machine:
    def __init__(self, model: Model, *, engine: str | Engine = Engine.INTERP,
                 hooks: Hooks | None = None, budget: int | None = DEFAULT_BUDGET):
        self.model = model
        self.arena = model.arena
        self.hooks = hooks or Hooks()
        self.budget = budget
        try:
            self.engine = Engine(engine)
        except ValueError:
            raise FirError(f"unknown engine '{engine}' (compiled or interp)") from None
        self.position = 0
        self.history: list[int] = []  # tokens fed so far, in order
        self.current_token: int | None = None
        self.kernel_runner = None  # set by the compiled engine (vm.compiled)
        # Set from another thread (a UI key) to stop a long run between instructions.
        self.stop_flag = threading.Event()
        if self.engine is Engine.COMPILED:
            from ..vm.compiled import CompiledRunner, StopFlag
            self.stop_flag = StopFlag()  # compiled kernels can see this one while they run
            # Long dispatches (attention at later positions) spread lanes over the threads
            # model/threads.adapt leaves this thread.
            self.kernel_runner = CompiledRunner(model, parallel=True)
        self._buffer_slices = [(r.base, r.base + r.size) for r in model.buffer_regions()]
        # (arena, kernel runner, {(budget, threads, f32 backend): per node (node, fn, args,
        # plain micro?)}): bound_calls()
        self._plain: tuple | None = None
        self._threads = 0  # what model/threads.adapt chose at the last begin_token
        self._unread: tuple | None = None  # (model, unread_nodes(model)): feed()
        # Look at the stop flag before every node too (runtime/interrupt.stop_between_nodes:
        # `firscope run`): kernels poll it while they run, ext ops and short kernels do not.
        self.stop_between_nodes = False

    # -- state ---------------------------------------------------------------
    def reset(self) -> None:
        """Zero every buffer (weights stay) and go back to position 0. A buffer whose bits
        are all zero already is not written: a freshly loaded arena's buffers are pages the
        process has not touched, which a read maps to the kernel's zero page (3 ms for
        GPT-2 small's 76 MB, mostly K/V cache) and a write makes real (150 ms, and the
        memory of every position before the decode reaches it)."""
        for a, b in self._buffer_slices:
            view = self.arena[a:b]
            if view.view(np.uint32).any():  # bits: a -0.0 is not zero here
                view.fill(0)
        self.position = 0
        self.history = []
        self.current_token = None

    def use_model(self, model: Model, *, reset: bool = True) -> None:
        """Run ``model`` from now on: a variant of this machine's model on the same arena,
        with other weights behind some ext nodes (the quantization workbench's,
        quant/variants.Bank.variant) or other kernels (an edit: runtime.load.with_kernels),
        whose plans the compiled engine then makes again; the calls are bound again.
        ``reset``: back to position 0 (a debugger swapping kernels mid-run keeps its place)."""
        if model.arena is not self.arena or len(model.nodes) != len(self.model.nodes):
            raise ValueError("use_model takes a variant of the same model (same arena and "
                             "plan)")
        same_kernels = all(a.program is b.program for a, b in zip(model.nodes, self.model.nodes))
        self.model = model
        self._plain = None
        if not same_kernels and self.engine is Engine.COMPILED:
            from ..vm.compiled import CompiledRunner
            self.kernel_runner = CompiledRunner(model, parallel=True)
        if reset:
            self.reset()

    @property
    def n_positions(self) -> int | None:
        return self.model.n_positions

    def check_token(self, token: int) -> None:
        vocab = self.model.vocab
        if not 0 <= token < vocab:
            raise FirError(f"token id {token} is outside the vocabulary 0..{vocab - 1}")

    def check_room(self, steps: int) -> None:
        limit = self.n_positions
        if limit is not None and self.position + steps > limit:
            raise FirError(f"decoding {steps} more token(s) from position {self.position} would "
                           f"reach position {self.position + steps - 1}, past n_positions "
                           f"{limit} (positions 0..{limit - 1})")

    # -- one step, in pieces -----------------------------------------------------
    def begin_token(self, token: int, *, position: int | None = None) -> None:
        """Write ``token`` and the position into the input buffers. A debugger that went
        back in time passes the position it is at now."""
        token = int(token)
        if position is not None:
            if not 0 <= position <= len(self.history):
                raise FirError(f"position {position} is not reachable: {len(self.history)} "
                               "tokens were fed")
            self.position = position
            del self.history[position:]
        self.check_token(token)
        self.check_room(1)
        # as many threads as the machine can give now (model/threads)
        self._threads = adapt_threads()
        m = self.model
        self.arena[m.inputs["token"].base] = token
        self.arena[m.inputs["position"].base] = self.position
        self.current_token = token

    def dispatch(self, node: PlanNode, **kw) -> Dispatch:
        return Dispatch(node.program, self.arena, **kw)

    def run_node(self, node: PlanNode) -> None:
        if self.stop_between_nodes and self.stop_flag.is_set():
            raise stopped_before(node)
        hooks = self.hooks
        if hooks.per_node:
            for h in hooks.before_node:
                h(self, node)
            t = time.perf_counter()
            self._execute(node)
            dt = time.perf_counter() - t
            for h in hooks.after_node:
                h(self, node, dt)
        else:
            self._execute(node)
        if hooks.at_node:
            for h in hooks.at_node.get(node.index, ()):
                h(self, node)

    def _execute(self, node: PlanNode) -> None:
        if node.kind == NodeKind.EXT:
            call = self.bound_call(node)  # the plain loop's, so that a profile times the same
            fn, args = (call.fn, call.args) if call else (EXT_IMPLS[node.target],
                                                          (self.arena, node))
            with np.errstate(all="ignore"):  # NaN/Inf propagate as on a GPU; break nan finds them
                fn(*args)
            return
        hooks = self.hooks
        if hooks.per_instruction:
            d = self.dispatch(node)
            for h in hooks.on_dispatch:
                h(self, node, d)
            d.run(self.budget, observer=_HookObserver(hooks))
            return
        runner = self.kernel_runner
        if runner is not None:
            call = self.bound_call(node)
            if call is not None and call.plain:
                self._plain_call(call)
                return
            runner.run(node, self.arena, self.budget, stop=self.stop_flag)
            return
        Dispatch(node.program, self.arena).run(self.budget, stop=self.stop_flag)

    def bound_call(self, node: PlanNode) -> BoundCall | None:
        """The plain loop's :class:`BoundCall` of ``node``; None for a node from outside the
        plan (a debugger's)."""
        calls = self.bound_calls()
        i = node.index
        return calls[i] if 0 <= i < len(calls) and calls[i].node is node else None

    def bound_calls(self) -> list[BoundCall]:
        """Per node of the plan, its :class:`BoundCall`: ``fn(*args)`` runs an ext node
        (plain False) or a compiled micro node on its plain driver (plain True, the call
        returns the driver's status: negative if the lane analysis was wrong); fn None:
        the node goes through the general path. What a benchmark times to see a kernel's
        own speed. Made once per arena and kernel runner for each budget, thread count
        (the calls are bound for one: adapt() may go back and forth between two on a busy
        machine, and binding GPT-2 small's took 2.7 ms) and f32 product backend; the same
        list while none of those changes."""
        cached = self._plain
        runner = self.kernel_runner
        threads = self._threads or matvec_threads()
        key = (self.budget, threads, gemv.BACKEND["f32"])
        if cached is None or cached[0] is not self.arena or cached[1] is not runner:
            cached = self._plain = (self.arena, runner, {})
        calls = cached[2].get(key)
        if calls is not None:
            return calls
        plain_call = getattr(runner, "plain_call", None)  # a sanitizer's wrapper has none
        calls = []
        for node in self.model.nodes:
            if node.kind == NodeKind.EXT:
                bind = EXT_CALLS.get(node.target)
                call = bind(self.arena, node, threads) if bind else None
                calls.append(BoundCall(node, *call, False) if call else
                             BoundCall(node, EXT_IMPLS[node.target], (self.arena, node), False))
                continue
            call = (plain_call(node, self.arena, self.budget, self.stop_flag, threads)
                    if plain_call else None)
            # a call came from plain_call: the runner is a CompiledRunner, which says
            calls.append(BoundCall(node, *call, True, runner.direct(call[0]))
                         if call else BoundCall(node, None, None, False))
        cached[2][key] = calls
        return calls

    def _plain_call(self, call: BoundCall) -> None:
        node, fn, args = call.node, call.fn, call.args
        if self.stop_flag.is_set():
            raise stopped_before(node)
        if fn(*args) < 0:
            self._plain = None
            self.kernel_runner.plain_broke(node)

    def _run_plain(self) -> None:
        """Every node of the plan, with no hook to call: the plain loop."""
        self._run_calls(self.bound_calls())

    def _run_calls(self, calls: list[BoundCall]) -> None:
        # One errstate for the step: the ext ops' (NaN/Inf propagate as on a GPU); nothing
        # else in the loop computes with NumPy.
        at_node = self.hooks.at_node  # the taps after chosen nodes (usually none)
        stop = self.stop_flag if self.stop_between_nodes else None
        with np.errstate(all="ignore"):
            for call in calls:
                node, fn, args, plain = call.node, call.fn, call.args, call.plain
                if stop is not None and stop.is_set():
                    raise stopped_before(node)
                if plain:
                    self._plain_call(call)
                elif fn is not None:
                    fn(*args)
                else:
                    self._execute(node)
                if at_node and node.index in at_node:
                    for h in at_node[node.index]:
                        h(self, node)

    def finish_token(self) -> StepResult:
        out = self.model.outputs["logits"]
        logits = self.arena[out.base: out.base + out.size].copy()
        result = StepResult(self.current_token, self.position, logits)
        self._advance()
        return result

    def _advance(self) -> None:
        """The current token is fed: the next step is at the next position."""
        self.history.append(self.current_token)
        self.position += 1
        self.current_token = None

    def rewind_token(self, token: int) -> None:
        """Undo :meth:`finish_token`: the last token fed is current again (its nodes ran)."""
        if not self.history:
            raise FirError("no token has finished: nothing to rewind")
        self.history.pop()
        self.position -= 1
        self.current_token = int(token)

    def unbegin_token(self) -> None:
        """Undo :meth:`begin_token`'s bookkeeping (the input buffers are the caller's to
        restore: the debugger's undo log has them)."""
        self.current_token = None

    def step(self, token: int) -> StepResult:
        self.begin_token(token)
        hooks = self.hooks
        if hooks.per_node or hooks.per_instruction:
            for node in self.model.nodes:
                self.run_node(node)
        else:
            self._run_plain()
        return self.finish_token()

    def feed(self, token: int) -> None:
        """One decode step for the state it leaves (the KV cache), not its outputs: the
        nodes whose results no node reads (GPT-2's head, 154 MB of a step's ~200 MB on
        GPT-2 small, which writes only the logits) are skipped, so ``output:`` buffers keep
        what they held; the rest run exactly as :meth:`step` runs them. For feeding a prompt
        whose next tokens are known (``firscope cost --at``). With any hook set, or a
        machine that steps its own way (the GPU engine's), it is :meth:`step`."""
        hooks = self.hooks
        if (hooks.per_node or hooks.per_instruction or hooks.at_node
                or type(self).step is not Machine.step):
            self.step(token)
            return
        self.begin_token(token)
        if self._unread is None or self._unread[0] is not self.model:
            self._unread = (self.model, unread_nodes(self.model))
        dead = self._unread[1]
        self._run_calls([c for c in self.bound_calls() if c.node.index not in dead])
        self._advance()

    def step_from(self, token: int, start: int,
                  prepare: Callable[["Machine"], None] | None = None) -> StepResult:
        """One decode step that runs only the plan's nodes from index ``start`` on (the plain
        loop, at_node taps included): ``prepare(machine)`` writes, after the input buffers,
        whatever the skipped nodes would have left for the rest (the quantization
        workbench's suffix replay, :mod:`firscope.quant.replay`)."""
        self.begin_token(token)
        if prepare is not None:
            prepare(self)
        self._run_calls(self.bound_calls()[start:])
        return self.finish_token()

    # -- generation ------------------------------------------------------------------
    def generate(self, prompt: list[int], n: int, *, temperature: float = 0.0,
                 seed: int | None = None,
                 on_step: Callable[[StepResult, int | None], None] | None = None,
                 prompt_logits: bool = True):
        """Feed ``prompt`` one token per step, then generate ``n`` tokens.

        Runs ``len(prompt) + n - 1`` steps (the last generated token is not
        fed back). Returns (generated ids, list of per-step logits).
        ``prompt_logits=False``: the prompt's tokens before its last are fed with
        :meth:`feed` (no outputs: GPT-2's head skipped), with no logits in the list for
        them and no ``on_step`` call.
        """
        if not prompt:
            raise FirError("the prompt is empty: give at least one token")
        for t in prompt:
            self.check_token(t)
        self.check_room(len(prompt) + max(n - 1, 0))
        rng = np.random.default_rng(seed)
        logits_all = []
        generated: list[int] = []
        pending = list(prompt)
        while pending:
            tok = pending.pop(0)
            if pending and not prompt_logits and not generated:  # the next token is known
                self.feed(tok)
                continue
            res = self.step(tok)
            logits_all.append(res.logits)
            nxt = None
            if not pending and len(generated) < n:
                nxt = choose_token(res.logits, temperature, rng)
                generated.append(nxt)
                if len(generated) < n:
                    pending.append(nxt)
            if on_step is not None:
                on_step(res, nxt)
        return generated, logits_all


def unread_nodes(model: Model) -> frozenset[int]:
    """Plan indices of the nodes whose every output region no node of the plan reads (an
    ext op's arguments, a kernel's loads): what they write reaches only the model's
    outputs, and no later step either (a step's nodes are the same each time)."""
    read: set[str] = set()
    for node in model.nodes:
        if node.kind == NodeKind.EXT:
            read.update(a.region.name for a in node.args if a.region is not None)
        else:
            read.update(op.args[op.spec.mem.address].region.name for op in node.program.ops
                        if op.spec.mem is not None and not op.spec.stores)
    dead = set()
    for node in model.nodes:
        written = ([o.region for o in node.outs if o.region is not None]
                   if node.kind == NodeKind.EXT else node.program.written_regions())
        if written and not any(r.name in read for r in written):
            dead.add(node.index)
    return frozenset(dead)


def choose_token(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    if not np.isfinite(logits).all():
        raise FirError("the logits contain NaN or Inf: there is no distribution to sample from "
                       "(break nan finds the node that made them; greedy decoding, "
                       "temperature 0, still runs)")
    # Shift before dividing: the largest logit becomes 0 whatever the temperature, and a tiny
    # one (1e-320) sends the others to -inf, whose exp is 0, instead of overflowing to NaN.
    z = logits.astype(np.float64) - float(logits.max())
    # The reference's exp (model/numerics), not NumPy's, whose last bit depends on the CPU's
    # SIMD dispatch: the same draw on every machine. Below -800, exp is 0 in f64 anyway.
    with np.errstate(over="ignore", under="ignore"):
        p = exp64_numpy(np.maximum(z / temperature, -800.0))
    p /= p.sum()
    return int(rng.choice(len(p), p=p))
