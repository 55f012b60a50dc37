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

Versions: the model's own code is version 0 of a kernel, each ``kernel edit`` of it the next
number. ``kernel toggle [NAME]`` keeps an edit but runs the model's own code again (A/B; a
second toggle runs the edit again). The session records which version ran each node of an
edited kernel at each token (``kernel history``); reverse execution restores the values the
nodes left, and a stop before (or inside) a node that last ran another version than the one
that runs now says so, since going forward runs the code running now.

A line breakpoint on an edited kernel's original line stops at the edit's instruction that
corresponds to it (the two kernels' instruction lines matched as a diff does: the same
instruction, or the one in its place in a changed run of equal length); one whose
instruction the edit dropped does not stop while the edit runs, and ``kernel edit`` says so.
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
    off: set = field(default_factory=set)  # edits kept while the model's own code runs
    number: dict[str, int] = field(default_factory=dict)  # name -> the edit's version
    made: dict[str, int] = field(default_factory=dict)  # name -> edits made so far
    # (token, node index) -> (kernel, version) that last ran it, for every kernel ever edited
    ran: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    # name -> (token, node index) where the session stood at its first edit: every node of
    # the kernel before that ran the model's own code
    first_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    _maps: dict = field(default_factory=dict)  # (name, edit number) -> _lines

    def edited_model(self):
        """The model with every kept edit, toggled off or not (what replay judges)."""
        from ..runtime.load import with_kernels
        return with_kernels(self.original, list(self.blocks.values()))

    def model(self, blocks: dict | None = None, off: set | None = None):
        """The model running ``blocks`` (the applied edits) less those ``off`` (toggled
        off); by default the session's own."""
        from ..runtime.load import with_kernels
        blocks = self.blocks if blocks is None else blocks
        off = self.off if off is None else off
        running = [b for n, b in blocks.items() if n not in off]
        if not running:
            return self.original
        return with_kernels(self.original, running)

    def line_map(self, name: str) -> dict[int, int]:
        """Original kernel line -> the running edit's line (identity-free: only lines of
        instructions that have a counterpart)."""
        return self._lines(name)[0]

    def _lines(self, name: str) -> tuple[dict[int, int], frozenset]:
        """(line_map, the original's instruction lines), made once per edit: breakpoint
        tables are mapped at every dispatch entered and every UI refresh."""
        import difflib
        key = (name, self.number.get(name))
        got = self._maps.get(key)
        if got is not None:
            return got
        a = _op_lines(self.original.kernels[name])
        b = _op_lines(self.edited_model().kernels[name])
        sm = difflib.SequenceMatcher(a=[t for _, t in a], b=[t for _, t in b], autojunk=False)
        mapped = {}
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
                mapped.update({a[i][0]: b[j][0] for i, j in zip(range(i1, i2), range(j1, j2))})
        got = self._maps[key] = (mapped, frozenset(line for line, _ in a))
        return got

    def map_lines(self, name: str, lines: dict) -> dict:
        """A kernel's line breakpoint table (line -> breakpoints) for the code that runs now:
        original lines moved to the edit's when the edit runs."""
        if not lines or self.running(name) == 0:
            return lines
        m, own = self._lines(name)
        out: dict = {}
        for line, bps in lines.items():
            if line in m:
                out.setdefault(m[line], []).extend(bps)
            elif line not in own:  # set on the edit's own lines while it runs
                out.setdefault(line, []).extend(bps)
        return out

    def running(self, name: str) -> int:
        """The version of ``name`` that runs now: 0 for the model's own code."""
        return 0 if name not in self.blocks or name in self.off else self.number[name]

    def label(self, name: str, version: int) -> str:
        if version == 0:
            return "the model's own code"
        file = self.files.get(name) if self.number.get(name) == version else None
        return f"edit {version}" + (f" ({printable(file.name)})" if file is not None else "")

    def observe(self, session, node) -> None:
        if node.target in self.made:
            self.ran[(session.step, node.index)] = (node.target, self.running(node.target))

    def ran_note(self, session) -> str | None:
        """A stop before (or inside) a node whose last run used another version than the
        one that runs now, in words; None otherwise."""
        node = session.node
        if node is None or node.target not in self.made:
            return None
        here = (session.step, node.index)
        got = self.ran.get(here)
        if got is None and here < self.first_at[node.target]:
            got = (node.target, 0)  # ran before the first edit
        now = self.running(node.target)
        if got is None or got[1] == now:
            return None
        return (f"note: {node.full_name} at token {session.step} last ran "
                f"{self.label(node.target, got[1])} of {node.target}; from here "
                f"{self.label(node.target, now)} runs")


def source_name(session, kernel: str) -> str:
    """The file a kernel's running code comes from: the edit's, while an edit runs."""
    edits = getattr(session, "kernel_edits", None)
    if edits is not None and edits.running(kernel):
        return printable(edits.files[kernel].name)
    return printable(session.model.path.name)


def _op_lines(program) -> list[tuple[int, str]]:
    """(line, instruction text) of each source line holding an instruction, in order."""
    seen: dict[int, str] = {}
    for op in program.ops:
        seen.setdefault(op.loc.line, op.text.strip())
    return sorted(seen.items())


def edits_of(session) -> KernelEdits:
    got = getattr(session, "kernel_edits", None)
    if got is None:
        got = session.kernel_edits = KernelEdits(session.model)
        session.observe_nodes(got.observe)
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
    model = edits.model(trial, edits.off - {name})  # raises before any change
    session.use_model(model)
    edits.blocks, edits.files[name] = trial, Path(path)
    edits.off.discard(name)
    edits.first_at.setdefault(name, (session.step, session.node_index))
    edits.made[name] = edits.made.get(name, 0) + 1
    edits.number[name] = edits.made[name]
    uses = sum(1 for n in model.nodes if n.target == name)
    said = (f"kernel {name} edited from {printable(path)} (edit {edits.number[name]}): "
            f"{uses} node(s) dispatch it from now on (kernel replay judges it here, kernel "
            f"toggle {name} runs the model's own code again, kernel revert {name} drops it)")
    lost = [bp for line, bps in session.breakpoints.lines(name).items()
            if line not in edits.line_map(name) for bp in bps]
    for bp in lost:
        said += (f"\nnote: breakpoint {bp.number} at {bp.location()}: the edit has no "
                 "instruction in its place; it does not stop while the edit runs")
    return said


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
        edits.off.discard(n)
    return f"reverted {', '.join(names)}: the model's own code runs from now on"


def toggle(session, name: str | None) -> str:
    """A/B: run the model's own code for an applied edit (kept), or run the kept edit
    again; without ``name``, every edit flips the same way (all off when any runs)."""
    edits = edits_of(session)
    if not edits.blocks:
        raise FirError("no kernel is edited (kernel edit NAME FILE)")
    if name is not None and name not in edits.blocks:
        raise FirError(f"kernel '{printable(name)}' is not edited "
                       f"({', '.join(edits.blocks)})")
    names = [name] if name is not None else list(edits.blocks)
    to_off = any(n not in edits.off for n in names)
    before = set(edits.off)
    edits.off = (edits.off | set(names)) if to_off else (edits.off - set(names))
    try:
        session.use_model(edits.model())
    except FirError:
        edits.off = before
        raise
    said = ", ".join(f"{n}: {edits.label(n, edits.running(n))}" for n in names)
    return (f"from now on {said} runs (A/B: kernel toggle again to switch; the edit is kept "
            "until kernel revert)")


def history(session) -> str:
    """Which version of each edited kernel ran each of its nodes, token by token."""
    edits = edits_of(session)
    if not edits.made:
        raise FirError("no kernel has been edited in this session")
    out = []
    for name in edits.made:
        out.append(f"{name}: runs {edits.label(name, edits.running(name))} now; "
                   f"{edits.made[name]} edit(s) made")
        runs: list[list] = []  # [version, first (token, index), last (token, index), count]
        for (tok, idx), (k, v) in sorted(edits.ran.items()):
            if k != name:
                continue
            if runs and runs[-1][0] == v:
                runs[-1][2] = (tok, idx)
                runs[-1][3] += 1
            else:
                runs.append([v, (tok, idx), (tok, idx), 1])
        if not runs:
            out.append("  no node of it has run since it was first edited")
        for v, a, b, n in runs:
            na, nb = session.nodes[a[1]].full_name, session.nodes[b[1]].full_name
            span = (f"token {a[0]} {na}" if a == b else
                    f"token {a[0]} {na} .. token {b[0]} {nb}")
            out.append(f"  {span}: {edits.label(name, v)} ({n} run(s))")
    return "\n".join(out)


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
    edited = edits.edited_model()
    lines = node_lines(_judge_here(session, edits.original, edited), edits.files[here.target])
    lines += _cost_pair(edits.original, edited, here.index, session.arena)
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
        e = Edit(edits.original, edits.edited_model(), next(iter(edits.files.values())),
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
            f"{cb.sectors_per_request:.1f}", *changed_lines(a, b, dev)]


SHOWN_LINES = 8


def changed_lines(a, b, dev) -> list[str]:
    """The counts of the source lines the edit changed (removed: -, added: +), each with
    executions, active lanes, sectors per request and its part of the predicted time, as
    ``cost --json`` gives per line; lines kept as they were are left out."""
    import difflib
    from ..cost.model import line_times

    def rows(nc):
        us = line_times(nc.counts, nc.prediction, dev)
        return [(ls, us.get(ln, 0.0)) for ln, ls in sorted(nc.counts.lines.items())]

    ra, rb = rows(a), rows(b)
    sm = difflib.SequenceMatcher(a=[ls.text for ls, _ in ra], b=[ls.text for ls, _ in rb],
                                 autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        out += [("-", *r) for r in ra[i1:i2]] + [("+", *r) for r in rb[j1:j2]]
    if not out:
        return ["  changed lines: none (the same instructions; the header or geometry changed)"]
    w = dev.simd_width

    def pct(v) -> str:
        return "   -" if v is None else f"{v:4.0%}"

    text = [f"  changed lines ({len(out)}; - before, + after):"]
    for sign, ls, us in out[:SHOWN_LINES]:
        spr = ls.sectors_per_request
        text.append(f"    {sign} line {ls.line:<4} {printable(ls.text)[:28]:<28} "
                    f"{ls.executions:>6} exec, {pct(ls.active_lane_share)} lanes, "
                    f"SIMD {pct(ls.simd_efficiency(w))}"
                    + (f", {spr:.1f} sect/req" if spr is not None else "")
                    + f", {us:.3f} us")
    if len(out) > SHOWN_LINES:
        text.append(f"    ... {len(out) - SHOWN_LINES} more (cost --json has every line)")
    return text


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
