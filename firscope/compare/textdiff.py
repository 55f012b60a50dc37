"""``firscope diff A.fir B.fir``: what changed between the two model files, and where the
divergence meets a change.

The files are cut into sections (the declarations, each kernel by name, the
graph's ``node``/``repeat`` lines; comments and blank lines left out) and
each section is compared line by line; a hunk shows both files' line
numbers. After the lockstep run, the first divergence is linked to the
changes: the diverging node's own line, its kernel's changed lines, and
whether the instruction that stored the diverging element is one of them.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from ..text import printable

CONTEXT = 2  # unchanged lines shown around a change


@dataclass(frozen=True)
class Change:
    section: str  # "kernel g2.attn_decode", "graph", "declarations"
    kind: str  # "-" only in A, "+" only in B
    a_line: int | None
    b_line: int | None
    text: str


@dataclass
class FirDiff:
    a: Path
    b: Path
    lines: list[str]  # the unified diff as printed
    changes: list[Change]
    a_to_b: dict[str, dict[int, int]]  # per section: A line -> B line of unchanged lines

    @property
    def same(self) -> bool:
        return not self.changes

    def in_section(self, section: str) -> list[Change]:
        return [c for c in self.changes if c.section == section]


def sections(path: Path) -> dict[str, list[tuple[int, str]]]:
    """Section name -> [(1-based line, text)] of a .fir file, comments and blanks left out."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for i, raw in enumerate(text.split("\n"), 1):
        line = raw.split("#", 1)[0].rstrip()
        words = line.split()
        if not words:
            continue
        if current is not None:
            out[current].append((i, line.strip()))
            if words[0] == "endkernel":
                current = None
            continue
        if words[0] == "kernel" and len(words) > 1:
            current = f"kernel {words[1]}"
            out.setdefault(current, []).append((i, line.strip()))
        elif words[0] in ("node", "repeat", "endrepeat"):
            out.setdefault("graph", []).append((i, line.strip()))
        else:
            out.setdefault("declarations", []).append((i, line.strip()))
    return out


def diff_fir(a: Path, b: Path) -> FirDiff:
    sa, sb = sections(Path(a)), sections(Path(b))
    names = list(sa) + [n for n in sb if n not in sa]
    fd = FirDiff(Path(a), Path(b), [], [], {})
    for name in names:
        _diff_section(fd, name, sa.get(name, []), sb.get(name, []))
    if fd.lines:
        fd.lines[:0] = [f"--- {printable(str(a))}", f"+++ {printable(str(b))}"]
    return fd


def _diff_section(fd: FirDiff, name: str, la, lb) -> None:
    ta, tb = [t for _, t in la], [t for _, t in lb]
    m = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    mapping = fd.a_to_b.setdefault(name, {})
    for tag, i1, i2, j1, j2 in m.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                mapping[la[i1 + k][0]] = lb[j1 + k][0]
    groups = list(m.get_grouped_opcodes(CONTEXT)) if ta != tb else []
    if not groups:
        return
    span = lambda ls: f"lines {ls[0][0]}-{ls[-1][0]}" if ls else "absent"  # noqa: E731
    fd.lines.append(f"{name} (A {span(la)}, B {span(lb)})")
    for group in groups:
        a0, b0 = group[0][1], group[0][3]
        fd.lines.append(f"@@ A {la[a0][0] if a0 < len(la) else '-'}, "
                        f"B {lb[b0][0] if b0 < len(lb) else '-'} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                fd.lines += [f"  {la[i][0]:>5} {lb[j1 + i - i1][0]:>5}  {printable(ta[i])}"
                             for i in range(i1, i2)]
                continue
            for i in range(i1, i2):
                fd.lines.append(f"- {la[i][0]:>5} {'':>5}  {printable(ta[i])}")
                fd.changes.append(Change(name, "-", la[i][0], None, ta[i]))
            for j in range(j1, j2):
                fd.lines.append(f"+ {'':>5} {lb[j][0]:>5}  {printable(tb[j])}")
                fd.changes.append(Change(name, "+", None, lb[j][0], tb[j]))


def _where(c: Change) -> str:
    return f"A line {c.a_line}" if c.a_line is not None else f"B line {c.b_line}"


def divergence_link(fd: FirDiff, report, model_a, model_b) -> list[str]:
    """Lines tying the first divergence to the changes (empty when nothing diverged)."""
    f = report.first_divergence
    if f is None or fd.same:
        return []
    node_a = model_a.nodes[f.node]
    kernel = f"kernel {node_a.target}"
    node_b = next((n for n in model_b.nodes if n.full_name == f.instance), None)
    kb = f"kernel {node_b.target}" if node_b is not None else kernel
    out = []
    graph = [c for c in fd.in_section("graph")
             if c.a_line == node_a.loc.line or (node_b is not None and c.b_line == node_b.loc.line)]
    if graph:
        out.append(f"the diverging node {f.instance} is declared on a changed line: "
                   + "; ".join(f"{_where(c)}: {printable(c.text)}" for c in graph))
    changed = fd.in_section(kernel) + (fd.in_section(kb) if kb != kernel else [])
    if changed:
        out.append(f"{f.instance} runs {node_a.target}, changed at "
                   + "; ".join(f"{_where(c)} ({c.kind}) {printable(c.text)}" for c in changed[:6])
                   + (f"; ... ({len(changed) - 6} more)" if len(changed) > 6 else ""))
    if f.writer is not None:
        line = f.writer.line
        hit = next((c for c in fd.in_section(kernel) if c.a_line == line), None)
        if hit is not None:
            out.append(f"the instruction that stored the diverging element (A line {line}) is "
                       f"a changed line: {printable(hit.text)}")
        elif line in fd.a_to_b.get(kernel, {}):
            out.append(f"the instruction that stored the diverging element is unchanged (A line "
                       f"{line}, B line {fd.a_to_b[kernel][line]}): the change above feeds it")
    stored = _weight_changes(node_a, node_b)
    if stored:
        out.append(f"{f.instance} reads " + "; ".join(stored))
    if not out:
        out.append(f"{f.instance} ({node_a.target}) and its line are unchanged: the divergence "
                   "comes from a changed input (an earlier node, a declaration or a weight)")
    return out


def _weight_changes(node_a, node_b) -> list[str]:
    """The node's weights that the two files store differently (a q4 weight one file makes
    f32 or regroups for this layer: ``except``, ``q4:gN``)."""
    if node_b is None:
        return []
    out = []
    for a, b in zip(node_a.args, node_b.args):
        wa, wb = a.weight, b.weight
        if wa is None or wb is None or wa.name != wb.name:
            continue
        da, db = wa.declared or wa.dtype, wb.declared or wb.dtype
        if da != db:
            out.append(f"weight {printable(wa.name)} as {da} in A and {db} in B")
    return out


def changes_dict(fd: FirDiff) -> list[dict]:
    return [{"section": c.section, "kind": c.kind, "a_line": c.a_line, "b_line": c.b_line,
             "text": c.text} for c in fd.changes]
