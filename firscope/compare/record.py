"""``firscope run --dump FILE [--dump-nodes PATTERN]``: the reference writes a dump.

A :class:`DumpRecorder` hangs on a machine's ``after_node`` hook and stores
the selected outputs of every node after it runs, under the step (the
token's position) and the node instance, with :class:`~firscope.dump.DumpWriter`.
Two firscope runs can then be diffed, and the file is a worked example of
the format for people writing a dumper for their own runtime.
"""
from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

from ..dump import DumpWriter, file_sha256
from ..errors import FirError
from ..text import printable
from ..runtime import Machine, Model, PlanNode
from .. import __version__
from .dumpfile import Dump


def select_outputs(model: Model, pattern: str | None) -> list[tuple[PlanNode, int]]:
    """(node, output index) pairs to dump. ``pattern``: comma-separated globs over the
    instance (``attention@*``, ``head``) or over ``instance/buffer`` (``*/x``); None: all."""
    every = [(n, i) for n in model.nodes for i in range(len(n.outs))]
    if pattern is None:
        return every
    globs = [g.strip() for g in pattern.split(",") if g.strip()]
    if not globs:
        raise FirError("--dump-nodes: give a pattern such as 'attention@*' or '*/x'")
    chosen = []
    used = set()
    for n, i in every:
        for g in globs:
            target = f"{n.full_name}/{n.outs[i].name}" if "/" in g else n.full_name
            if fnmatch.fnmatchcase(target, g):
                chosen.append((n, i))
                used.add(g)
                break
    unused = [g for g in globs if g not in used]
    if unused:
        names = ", ".join(n.full_name for n in model.nodes[:6])
        raise FirError(f"--dump-nodes: '{unused[0]}' matches no node output of "
                       f"{model.path.name} (instances: {names}, ...; 'NAME@*' matches every "
                       "layer, 'INSTANCE/BUFFER' one output)")
    return chosen


def check_replaceable(path) -> None:
    """``--dump FILE`` replaces an existing file only when it is a dump (a non-empty file
    whose every tensor key is spelled ``step{S}/{instance}/{buffer}``): a typo must not
    turn a checkpoint, a model or any other file into a dump."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return  # absent (the usual case), or the writer says what is wrong
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return  # a link is replaced, not followed; the writer refuses folders and devices
    try:
        dump = Dump(p)
        try:
            other = next((k for k, e in dump.entries.items() if e.step is None), None)
        finally:
            dump.close()
    except FirError:
        why = "it cannot be read as one"
    else:
        if other is None:
            return
        why = f"it holds '{printable(other)}', not a step{{S}}/INSTANCE/BUFFER key"
    raise FirError(f"{printable(str(p))}: exists and is not a dump ({why}); --dump replaces "
                   "only a dump: remove the file or choose another name")


class DumpRecorder:
    """Writes the selected node outputs of every step a machine runs into a dump file."""

    def __init__(self, machine: Machine, path, *, pattern: str | None = None,
                 steps: int = 0):
        model = machine.model
        self.machine = machine
        self.path = path
        selection = select_outputs(model, pattern)
        check_replaceable(path)
        self.outputs: dict[int, list[int]] = {}
        for node, i in selection:
            self.outputs.setdefault(node.index, []).append(i)
        try:
            self.writer = DumpWriter(path, model=file_sha256(model.path),
                                     producer=f"firscope {__version__} run "
                                              f"(engine {machine.engine})",
                                     expected_keys=steps * len(selection))
        except OSError as e:
            raise FirError(f"{path}: cannot write the dump: {e.strerror or e}") from None
        machine.hooks.after_node.append(self._after_node)

    def _after_node(self, machine: Machine, node: PlanNode, seconds: float) -> None:
        for i in self.outputs.get(node.index, ()):
            out = node.outs[i]
            try:
                self.writer.add(machine.position, node.full_name, out.name,
                                machine.model.view(out.region))
            except OSError as e:
                raise FirError(f"{self.path}: cannot write the dump: {e.strerror or e}") \
                    from None

    def close(self) -> None:
        """Finish the file (its ``tokens`` are the tokens the machine was fed)."""
        self._detach()
        self.writer.metadata["tokens"] = ",".join(str(t) for t in self.machine.history)
        try:
            self.writer.close()
        except OSError as e:
            raise FirError(f"{self.path}: cannot write the dump: {e.strerror or e}") from None

    def abort(self) -> None:
        self._detach()
        self.writer.abort()

    def _detach(self) -> None:
        if self._after_node in self.machine.hooks.after_node:
            self.machine.hooks.after_node.remove(self._after_node)
