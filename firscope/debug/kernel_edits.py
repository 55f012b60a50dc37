"""Kernels edited where the debugger stands: ``kernel edit NAME FILE``, ``kernel replay
[NODE] [--all]``, ``kernel revert NAME``, ``kernel write`` (batch mode, the console, DAP's
REPL and its ``firscope/kernel`` request).

An edit applies to the session at once: every later dispatch of that kernel runs the edited
code (the session swaps to the same model with the kernel replaced, on the same arena, from
where it stands, between two nodes). ``kernel replay`` judges the edit on the inputs the
current node has now (the session's own state, not a re-run): both versions run on copies of
its regions, the original first; ``--all`` replays every node that uses an edited kernel over
the tokens fed so far (from token 0, on a copy: the session does not move). ``kernel write``
puts the edited blocks into the model file in place of the original ones, every other line
untouched, after copying the original to a backup beside it.

What it does not do: undo records do not say which version of a kernel ran a node (reverse
execution restores values, and the session keeps the current version); a line breakpoint
in an edited kernel's original lines does not stop in the edited code.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FirError
from ..fir import syntax as S
from ..text import printable


@dataclass
class KernelEdits:
    """What the session has edited: the model as loaded, and per kernel the edit's file and
    block (in the order applied)."""

    original: object  # runtime.Model as loaded
    files: dict[str, Path] = field(default_factory=dict)
    blocks: dict[str, object] = field(default_factory=dict)  # name -> fir.syntax.Kernel
    # the cost of the code running now at the last node previewed: (model, node, step) ->
    # NodeCost; a draft checked again and again there costs only its own side
    cost_before: dict = field(default_factory=dict)

    def model(self):
        from ..runtime.load import with_kernels
        if not self.blocks:
            return self.original
        return with_kernels(self.original, list(self.blocks.values()))


def edits_of(session) -> KernelEdits:
    got = getattr(session, "kernel_edits", None)
    if got is None:
        got = session.kernel_edits = KernelEdits(session.model)
    return got


def edit(session, name: str, path: str) -> str:
    """Replace kernel ``name`` with the one block of that name in ``path``; the session goes
    on with it. Nothing changes on any error (positioned in the file)."""
    from ..fir.parser import parse_kernels
    edits = edits_of(session)
    blocks = parse_kernels(path)
    mine = [k for k in blocks if k.name.text == name]
    if not mine:
        found = ", ".join(k.name.text for k in blocks)
        raise FirError(f"{printable(path)} holds no kernel '{printable(name)}' (it holds "
                       f"{printable(found)})", blocks[0].name.loc)
    if name not in edits.original.kernels:
        raise FirError(f"the model has no kernel '{printable(name)}'", mine[0].name.loc)
    trial = dict(edits.blocks)
    trial[name] = mine[0]
    from ..runtime.load import with_kernels
    model = with_kernels(edits.original, list(trial.values()))  # raises before any change
    session.use_model(model)
    edits.blocks, edits.files[name] = trial, Path(path)
    uses = sum(1 for n in model.nodes if n.target == name)
    return (f"kernel {name} edited from {printable(path)}: {uses} node(s) dispatch it from now "
            f"on (kernel replay judges it here, kernel revert {name} undoes it)")


def preview(session, name: str, path: str) -> str:
    """The draft in ``path`` assembled (errors positioned in it) and, when the session
    stands before a node that runs ``name``, judged there against the code running now: the
    A/B report and the cost before/after. The session is not changed."""
    from ..edit.command import node_lines
    edits = edits_of(session)
    trial = _draft(edits, name, path)
    here = session.node
    if here is None or here.target != name or session.dispatch is not None:
        return (f"assembled: {name} has {len(trial.kernels[name].ops)} instructions. The "
                f"session does not stand before a node that runs it: apply it (ctrl+t) and "
                "go to one, or kernel replay --all")
    lines = node_lines(_judge_here(session, session.model, trial),
                       f"{session.model.path.name} (draft)")
    lines += _cost_pair(session.model, trial, here.index, session.arena,
                        cache=(edits.cost_before, (id(session.model), here.index, session.step)))
    others = [n.full_name for n in trial.nodes if n.target == name and n.index != here.index]
    if others:
        shown = ", ".join(others[:6]) + (f", ... ({len(others) - 6} more)" if len(others) > 6
                                         else "")
        lines.append(f"  also run by {len(others)} other node(s): {shown}; once applied, "
                     "kernel replay --all judges every one over the tokens so far")
    return "\n".join(lines)


def _draft(edits: KernelEdits, name: str, path: str):
    """The model with the applied edits and the draft of ``name`` in ``path`` (assembled:
    errors positioned in the file); nothing is applied."""
    from ..fir.parser import parse_kernels
    from ..runtime.load import with_kernels
    blocks = [k for k in parse_kernels(path) if k.name.text == name]
    if not blocks:
        raise FirError(f"the draft holds no kernel '{printable(name)}' (keep its name)")
    return with_kernels(edits.original, [*(v for k, v in edits.blocks.items() if k != name),
                                         blocks[0]])


def _judge_here(session, model_a, model_b):
    """The node the session stands before, run by ``model_a``'s and ``model_b``'s code on the
    inputs it has now (copies: the session is not changed)."""
    from ..edit.replay import NodeAB, judge_edit, run_original, start_of
    here = session.node
    a, b = model_a.nodes[here.index], model_b.nodes[here.index]
    start = start_of(a, b, session.arena)
    budget = session.machine.budget
    return NodeAB(here.index, here.full_name, here.target,
                  [judge_edit(a, b, start, run_original(a, start, budget), budget,
                              session.step)])


def revert(session, name: str | None) -> str:
    edits = edits_of(session)
    names = list(edits.blocks) if name in (None, "--all") else [name]
    for n in names:
        if n not in edits.blocks:
            raise FirError(f"kernel '{printable(n)}' is not edited "
                           f"({', '.join(edits.blocks) or 'nothing is'})")
    trial = {k: v for k, v in edits.blocks.items() if k not in names}
    before = edits.blocks
    edits.blocks = trial
    try:
        session.use_model(edits.model())
    except FirError:
        edits.blocks = before
        raise
    for n in names:
        edits.files.pop(n, None)
    return f"reverted {', '.join(names)}: the model's own code runs from now on"


def replay_here(session, node: str | None = None, every: bool = False) -> str:
    """The A/B report of the edit at the current node (or ``node``'s, when the session stands
    before it), or of every node using an edited kernel over the tokens so far."""
    from ..edit.command import node_lines
    edits = edits_of(session)
    if not edits.blocks:
        raise FirError("no kernel is edited (kernel edit NAME FILE)")
    if every:
        return _replay_all(session, edits)
    here = session.node
    if here is None:
        raise FirError("the run has ended: kernel replay --all replays the tokens fed")
    if node is not None and node != here.full_name:
        raise FirError(f"the session stands before {here.full_name}, not {printable(node)}: "
                       f"goto {printable(node)} first, or kernel replay --all")
    if here.target not in edits.blocks:
        raise FirError(f"{here.full_name} runs {here.target}, which is not edited "
                       f"({', '.join(edits.blocks)}); go to a node that runs it")
    if session.dispatch is not None:
        raise FirError("inside a dispatch: kernel replay judges a node from its start "
                       "(finish it, or reverse-next)")
    lines = node_lines(_judge_here(session, edits.original, session.model),
                       edits.files[here.target])
    lines += _cost_pair(edits.original, session.model, here.index, session.arena)
    return "\n".join(lines)


def preview_all(session, name: str, path: str) -> str:
    """The draft in ``path`` judged against the code running now at every node that runs
    ``name``, over the tokens fed so far (replayed from token 0 on a copy)."""
    from ..edit.replay import Edit
    edits = edits_of(session)
    trial = _draft(edits, name, path)
    return _replay_all(session, edits, Edit(session.model, trial, Path(path), (name,)),
                       f"{session.model.path.name} (draft)")


def _replay_all(session, edits, e=None, where=None) -> str:
    from ..edit.command import node_lines
    from ..edit.replay import Edit, replay
    fed = list(session.sequence[: session.step + 1])
    if e is None:
        e = Edit(edits.original, session.model, next(iter(edits.files.values())),
                 tuple(edits.blocks))
    report = replay(e, fed, 0, engine="interp", budget=session.machine.budget)
    out = [f"every node that runs an edited kernel, over the {len(fed)} token(s) fed so far "
           "(replayed from token 0 on a copy):"]
    for n in report.nodes:
        out += node_lines(n, where or edits.files.get(n.kernel, e.path))
    out.append("identical" if report.identical else "DIFFERENT")
    return "\n".join(out)


def _cost_pair(model_a, model_b, index: int, arena, cache=None) -> list[str]:
    """Node ``index``'s predicted GPU cost in ``model_a`` and ``model_b``, from its inputs in
    ``arena``; ``cache``: (dict, key) keeping model_a's side for the same stop."""
    from ..cost import find_device
    from ..cost.analyze import analyse_node
    from ..runtime.machine import DEFAULT_BUDGET
    from ..vm.runaway import runaway_stop
    node_a, node_b = model_a.nodes[index], model_b.nodes[index]
    if runaway_stop(node_b.program, DEFAULT_BUDGET) is not None:
        return ["  cost: the edit runs past the instruction budget: no prediction"]
    dev = find_device(None)
    try:
        kept, key = cache if cache is not None else ({}, None)
        a = kept.get((key, dev.key)) if key is not None else None
        if a is None:
            a = analyse_node(model_a, node_a, dev, arena)
            if key is not None:
                kept.clear()
                kept[(key, dev.key)] = a
        b = analyse_node(model_b, node_b, dev, arena)
    except FirError as e:
        return [f"  cost: {printable(str(e).splitlines()[0])}"]
    pa, pb = a.prediction, b.prediction
    ca, cb = a.counts, b.counts
    return [f"  predicted on {printable(dev.name)}: {pa.predicted_us:.2f} -> "
            f"{pb.predicted_us:.2f} us ({pb.predicted_us / pa.predicted_us:.2f}x), "
            f"{pa.bound} -> {pb.bound}, SIMD efficiency {ca.simd_efficiency:.0%} -> "
            f"{cb.simd_efficiency:.0%}, sectors/request {ca.sectors_per_request:.1f} -> "
            f"{cb.sectors_per_request:.1f}"]


def write(session) -> str:
    """Put every edited block into the model file in place of the original's lines; the
    original is copied first to ``FILE.orig`` (``FILE.orig.N`` when that name is taken)."""
    edits = edits_of(session)
    if not edits.blocks:
        raise FirError("no kernel is edited: nothing to write")
    path = Path(edits.original.path)
    lines = path.read_text(encoding="utf-8").split("\n")
    spans = []
    for name, block in edits.blocks.items():
        k = next(d for d in edits.original.fir.of(S.Kernel) if d.name.text == name)
        new = Path(edits.files[name]).read_text(encoding="utf-8").split("\n")
        spans.append((k.loc.line, k.end.line, new[block.loc.line - 1: block.end.line]))
    for first, last, text in sorted(spans, reverse=True):
        lines[first - 1: last] = text
    backup = _backup_name(path)
    from ..runtime.opening import write_output
    write_output(backup, path.read_bytes(), "the backup")
    write_output(path, "\n".join(lines).encode("utf-8"), "the model file")
    names = ", ".join(edits.blocks)
    return (f"wrote {names} into {printable(path)} (the original is in {printable(backup)}); "
            "F2 or a new session loads it")


def _backup_name(path: Path) -> Path:
    cand = path.with_name(path.name + ".orig")
    n = 1
    while os.path.lexists(cand):
        cand = path.with_name(f"{path.name}.orig.{n}")
        n += 1
    return cand
