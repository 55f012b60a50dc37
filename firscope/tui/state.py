"""What the panes show at one stop, frozen: built where the session may be read, then handed
to the UI thread as a Message.

:func:`build_view` is the only place in the UI that reads the live session. It
runs in the engine worker right after a command (or on the UI thread while no
worker runs) and copies what the panes need beside the engine's own
:class:`~firscope.debug.snapshot.Snapshot`: breakpoint marks, the token pieces,
the per-kernel line counts, the values of the buffer the Buffers tab follows,
the attention maps recorded so far and the logit lens. Widgets render a
:class:`StopView` (plus the static model) and nothing else, so a run in a worker
can never change what is on screen halfway.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np
from rich.text import Text

from ..compare.report import divergence_sentence
from ..debug.breakpoints import LineBreakpoint, NodeBreakpoint, SanitizerCatchpoint
from ..debug.snapshot import Snapshot, token_of, token_range
from ..errors import FirError
from ..model import Ref
from ..text import printable, web_piece
from ..runtime import NodeKind

from .stats import with_stats

NEXT_INPUTS = ""  # the Buffers tab's default: the next node's inputs
FINDING_MARK = "!"  # after a node's name, and in the source gutter: a sanitizer finding


@dataclass(frozen=True)
class Wants:
    """What the visible panes ask for beyond the snapshot (decided on the UI thread)."""

    buffer: str = NEXT_INPUTS  # name the Buffers tab shows ("" = the next node's inputs)
    lens: bool = False  # the Lens tab is showing: compute the layer x top-5 table


@dataclass(frozen=True)
class Marks:
    """Enabled breakpoints as the gutters show them."""

    nodes: frozenset = frozenset()  # {(name, layer or None)}
    kernels: frozenset = frozenset()  # kernels with a line breakpoint
    lines: Mapping[str, frozenset] = field(default_factory=lambda: MappingProxyType({}))

    def node_marked(self, node) -> str:
        if (node.name, None) in self.nodes or (node.name, node.layer) in self.nodes:
            return "●"
        if node.kind == NodeKind.MICRO and node.target in self.kernels:
            return "○"
        return " "


@dataclass(frozen=True)
class FindingMarks:
    """Sanitizer findings (``break race``/``break uninit``) as the graph pane and the source
    gutter mark them: the node instances they happened in, the .fir lines involved."""

    nodes: frozenset = frozenset()  # node indices
    lines: Mapping[str, frozenset] = field(default_factory=lambda: MappingProxyType({}))
    texts: tuple[str, ...] = ()  # one headline per finding

    def node_marked(self, node) -> bool:
        return node.index in self.nodes

    def line_marked(self, kernel: str, line: int) -> bool:
        return line in self.lines.get(kernel, ())


def findings_of(session) -> FindingMarks:
    nodes: set[int] = set()
    lines: dict[str, set] = {}
    texts = []
    for bp in session.breakpoints:
        if not isinstance(bp, SanitizerCatchpoint):
            continue
        for f in bp.findings():
            nodes.update(f.node_indices or (f.node_index,))
            if f.kernel is not None:
                lines.setdefault(f.kernel, set()).update(f.lines)
            texts.append(f.headline())
    return FindingMarks(frozenset(nodes), MappingProxyType({k: frozenset(v)
                                                            for k, v in lines.items()}),
                        tuple(texts))


@dataclass(frozen=True)
class BufferPeek:
    """The Buffers tab's data: one array per name shown (read-only copies)."""

    names: tuple[str, ...]  # display names ("x", "key_cache@1", "qkvw@0")
    arrays: tuple[np.ndarray, ...]
    weight: tuple[bool, ...]  # a weight (never changes: statistics can be cached)
    error: str | None = None
    title: str = ""
    # computed with them in the worker (stats.with_stats): the statistics of the one buffer
    # shown (Rich text), a summary per input, a q4 weight's dequantization error
    stats: object | None = None
    summaries: tuple = ()
    q4_error: object | None = None


@dataclass(frozen=True)
class LensPeek:
    rows: tuple = ()  # LensRow
    pieces: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    error: str | None = None


@dataclass(frozen=True)
class DiffPeek:
    """This session against an attached dump, frozen for the Diff tab and the graph."""

    step: int  # the token the errors are of
    errors: tuple  # compare.views.NodeError of the compared nodes, graph order
    severity: Mapping[int, object]  # node index -> Severity, for the graph pane
    first: str | None  # the first divergence so far, as a sentence
    buffer: object | None  # compare.views.BufferView of the last compared node
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StopView:
    snapshot: Snapshot
    status: str  # ci.status_line: the header's stop description
    header: str  # model · q4 · token 3 of 0..11 'f' pos 3
    pieces: tuple[str, ...]  # the piece of every token in the sequence
    n_prompt: int
    lane: int  # the focused lane
    register: tuple[str, int]  # the register shown across lanes
    marks: Marks
    kernel_counts: Mapping[str, np.ndarray]  # kernel -> per-pc counts of its last dispatch
    buffer: BufferPeek | None
    attention: Mapping[tuple, np.ndarray]  # (step, layer) -> [heads, positions] probabilities
    lens: LensPeek | None
    patched: int  # active patches (set): the header says the run is patched
    diff: DiffPeek | None = None  # against a dump (--against)
    findings: FindingMarks = FindingMarks()  # what break race / break uninit found so far
    place: str = ""  # the header's token part alone (kept when the model part does not fit)

    @property
    def node_index(self) -> int | None:
        return self.snapshot.location.node_index


def marks_of(session) -> Marks:
    table = session.breakpoints
    lines: dict[str, set] = {}
    for bp in table.enabled(LineBreakpoint):
        lines.setdefault(bp.kernel, set()).add(bp.line)
    edits = getattr(session, "kernel_edits", None)
    if edits is not None:  # original lines shown where they stop in a running edit
        lines = {k: set(edits.map_lines(k, dict.fromkeys(v, ()))) for k, v in lines.items()}
    return Marks(frozenset((bp.node, bp.layer) for bp in table.enabled(NodeBreakpoint)),
                 frozenset(lines), MappingProxyType({k: frozenset(v) for k, v in lines.items()}))


def model_of(session) -> str:
    """The header's model part: ``tiny-gpt2 · q4``."""
    m = session.model
    edits = getattr(session, "kernel_edits", None)
    names = [f"{printable(n)} (edit {edits.number[n]}{' off' if n in edits.off else ''})"
             for n in edits.blocks] if edits is not None else list(map(printable, m.edited))
    edited = f" · edited: {', '.join(names)}" if names else ""
    return f"{printable(m.name)} · {'f32' if m.fir_f32 else 'q4'}{edited}"


def place_of(session, tokenizer) -> str:
    """The header's token part, numbered as everywhere else (:func:`token_of`)."""
    if session.finished:
        return f"finished: tokens {token_range(session.total_steps)} ran"
    piece = web_piece(tokenizer.piece(session.token)) if session.token is not None else "?"
    return f"{token_of(session.step, session.total_steps)} {piece!r} pos {session.step}"


def header_of(session, tokenizer) -> str:
    return f"{model_of(session)} · {place_of(session, tokenizer)}"


def _frozen(a) -> np.ndarray:
    out = np.array(a, copy=True)
    out.setflags(write=False)
    return out


def peek_buffers(session, wanted: str) -> BufferPeek:
    """Copies of the buffer the user asked for, or of the next node's inputs."""
    if wanted.strip() == NEXT_INPUTS:
        node = session.node
        if node is None:
            return BufferPeek((), (), (), error="generation is over: type a name to look at it",
                              title="next node's inputs")
        names, arrays, weight = [], [], []
        for arg in node.args:
            if arg.kind not in ("buffer", "weight"):
                continue
            value = _value(session, *_split(arg.display))
            names.append(arg.display)
            arrays.append(value if arg.kind == "weight" else _frozen(value))
            weight.append(arg.kind == "weight")
        return BufferPeek(tuple(names), tuple(arrays), tuple(weight),
                          title=f"inputs of {node.full_name}")
    name, layer = _split(wanted.strip())
    try:
        value = _value(session, name, layer)
    except FirError as e:
        return BufferPeek((), (), (), error=str(e), title=wanted)
    is_weight = name not in session.model.buffers
    if layer is None and session.layer is not None and _per_layer(session.model, name):
        layer = session.layer
    label = str(Ref(name, layer))
    return BufferPeek((label,), (value if is_weight else _frozen(value),), (is_weight,),
                      title=label)


def _value(session, name: str, layer: int | None) -> np.ndarray:
    return np.asarray(session.buffer_value(name, layer))


def _split(text: str) -> tuple[str, int | None]:
    ref = Ref.parse(text)
    return ref.name, ref.layer


def _per_layer(model, name: str) -> bool:
    if name in model.buffers:
        return model.buffers[name].per_layer
    return any(w.decl == name and w.layer is not None for w in model.weights.values())


def peek_lens(session, tokenizer) -> LensPeek:
    from ..debug.lens import lens
    try:
        rows = lens(session, k=5, every_layer=True)
    except FirError as e:
        return LensPeek(error=e.message)
    pieces = {t: web_piece(tokenizer.piece(t)) for row in rows for t, _ in row.top}
    return LensPeek(tuple(rows), MappingProxyType(pieces))


def build_view(session, ci, tokenizer, recorder, wants: Wants) -> StopView:
    """Freeze everything the panes show now (read the live session only here)."""
    snap = ci.last
    try:
        buffer = peek_buffers(session, wants.buffer)
    except FirError as e:
        buffer = BufferPeek((), (), (), error=str(e), title=wants.buffer)
    buffer = with_stats(session.model, buffer)
    return StopView(
        snapshot=snap, status=ci.status_line(snap), header=header_of(session, tokenizer),
        place=place_of(session, tokenizer),
        pieces=tuple(web_piece(tokenizer.piece(t)) for t in session.sequence),  # font-safe
        n_prompt=len(session.prompt), lane=ci.lane, register=ci.register,
        marks=marks_of(session),
        kernel_counts=MappingProxyType({k: _frozen(v) for k, v in session.line_counts.items()}),
        buffer=buffer,
        attention=MappingProxyType(dict(recorder.maps)) if recorder is not None else
        MappingProxyType({}),
        lens=peek_lens(session, tokenizer) if wants.lens else None,
        patched=len(session.patches), diff=peek_diff(session),
        findings=findings_of(session))


def peek_diff(session) -> DiffPeek | None:
    """The attached dump's results for the token being decoded (or the one just finished)."""
    ref = getattr(session, "reference", None)
    if ref is None:
        return None
    from ..compare.views import buffer_view, node_errors
    step = session.step
    shown = ref.shown  # with --isolate, each node's own error
    if not any(k[0] == step for k in shown) and step > 0:
        step -= 1  # between tokens: what the last one compared
    results = {k[1]: v for k, v in shown.items() if k[0] == step}
    errors = tuple(e for e in node_errors(session.model.nodes, results, ref.tolerance.rtol)
                   if e.node in results)
    first = ref.first_divergence(own=ref.view_own)
    head = "first node wrong on its own" if ref.view_own else "first divergence"
    first_text = None if first is None else divergence_sentence(
        head, first.step, first.instance, first.buffer, first.diff)
    buffer = None
    last = ref.last
    # the reference side is the arena as the node left it: only right after that node
    if last is not None and last == (session.step, session.node_index - 1) \
            and ref.results.get(last) and session.dispatch is None and not ref.view_own:
        res = max(ref.results[last], key=lambda r: (r.diff.diverged, r.diff.rel_l2))
        node = session.nodes[last[1]]
        other = ref.other_value(last[0], node, res.buffer)
        out = next(o for o in node.outs if o.name == res.buffer)
        if other is not None:
            buffer = buffer_view(res, session.model.view(out.region), other)
    notes = tuple(f"step {s}: {why}" for s, why in sorted(ref.skipped.items()))
    if ref.view_own:
        missing = [ref.model.nodes[n].full_name for s, n in sorted(ref.not_judged) if s == step]
        notes += (f"coloured by each node's own error (run from the dump's inputs); "
                  f"{len(missing)} not judged" + (f": {', '.join(missing[:6])}" if missing
                                                  else ""),)
    return DiffPeek(step, errors, MappingProxyType({e.node: e.severity for e in errors}),
                    first_text, buffer, notes)


def status_bar(status: str, view: StopView | None, width: int, *, busy: bool = False,
               error: bool = False):
    """The header line: stop description (or a message), token and position, model. When it
    is too long the model part goes first, then a stop description is cut, never the token
    and position; a message (an error, where the report went) keeps its words."""
    tail = "" if view is None else "  ·  " + view.header
    patched = f"  · patched ({view.patched})" if view is not None and view.patched else ""
    mark = " ▶ " if busy else " ■ "
    room = width - len(" firscope ") - len(mark) - len(patched)
    if view is not None and len(status) + len(tail) > room and view.place:
        tail = "  ·  " + view.place
        if len(status) + len(tail) > room and status == view.status:
            status = status[: max(room - len(tail) - 1, 12)] + "…"
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" firscope ", style="bold reverse")
    t.append(mark + status, style="bold green" if busy else ("bold red" if error
                                                             else "bold yellow"))
    t.append(tail)
    if patched:
        t.append(patched, style="bold magenta")
    t.truncate(width, overflow="ellipsis")
    return t
