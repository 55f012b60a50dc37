"""What every backend's code generator shares: the walk over a program's ops.

A backend (vm/codegen: numba, the compiled reference engine; vm/wgsl: WGSL, the
GPU engine's) is a :class:`Renderer` subclass plus a table of renderers, one
per mnemonic of vm/opcodes.OPCODES, as tinygrad gives each backend its
``code_for_op`` (tinygrad/renderer/cstyle.py). A renderer is
``render(gen, op) -> lines``: the op's statements, unindented (a renderer
indents only what it nests itself, with :func:`indent`). The walk
(:meth:`Renderer.block`) indents: an opener (``forbegin``, ``ifbegin``)
renders its block's header, the walk indents the block (body and closer)
under it and asks the backend how a block ends (:meth:`Renderer.close`:
nothing for Python, a brace for WGSL). The enclosing loops of the op being
rendered are :attr:`Renderer.loops`.

Operands reach a template as texts (:meth:`Renderer.operand_texts`): each
operand kind's row (vm/operands.OPERAND_KINDS) names the method that writes
it (``register_text``, ``uint32_text``, ``f32_text``, ``address_text``): a
register's number, or the name of the slot the backend keeps the node's
value in. A backend defines the slot methods its templates use.

A new backend is one module: a Renderer subclass, its table, the module text
around the walk's lines; then its runner. docs/extending.md lists the files.
"""
from __future__ import annotations

from typing import Callable, Mapping

from .isa import FrameKind
from .operands import OPERAND_KINDS

IND = "    "


def indent(lines: list[str], levels: int = 1) -> list[str]:
    """``lines`` nested ``levels`` deeper."""
    pad = IND * levels
    return [pad + line for line in lines]


class Renderer:
    """The walk over one bound program's ops, for a backend to specialize.

    ``code_for_op``: mnemonic -> renderer (the backend's table). :meth:`render_of`
    looks an op's renderer up there; the hooks (:meth:`straight`, :meth:`close`,
    :meth:`empty`) default to what a language with braces and no instruction
    counting needs.
    """

    code_for_op: Mapping[str, Callable[["Renderer", object], list[str]]] = {}

    def __init__(self, program):
        self.p = program
        self.ops = program.ops
        self.loops: tuple[int, ...] = ()  # pcs of the forbegins enclosing the op rendered
        self.loop_pcs: dict[int, tuple[int, ...]] = {}  # pc -> its enclosing loops

    # -- one op -----------------------------------------------------------------------------
    def render_of(self, op) -> Callable:
        return self.code_for_op[op.spec.mnemonic]

    def lines_of(self, op) -> list[str]:
        return self.render_of(op)(self, op)

    def operand_texts(self, op) -> list[str]:
        """Each operand as a template sees it (``{0}``, ``{1}``, ...)."""
        return [getattr(self, OPERAND_KINDS[kind].text)(a)
                for kind, a in zip(op.spec.operands, op.args)]

    def register_text(self, n: int) -> str:
        return str(int(n))

    def uint32_text(self, v: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no text for a K operand")

    def f32_text(self, v) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no text for an F operand")

    def address_text(self, addr) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no text for an A operand")

    def registers(self, file: str) -> list[int]:
        """The numbers of the registers of ``file`` ('R' or 'U') the program names."""
        return sorted(n for f, n in self.p.registers() if f == file)

    # -- the walk -----------------------------------------------------------------------------
    def block(self, a: int, b: int) -> list[str]:
        """The lines of ops ``a`` to ``b - 1``, unindented. An opener's block (its body and
        its closer) is indented under the opener's header."""
        out: list[str] = []
        run: list[int] = []  # pcs of the straight run so far (an opener ends one)
        stmts: list[str] = []
        pc = a
        while pc < b:
            op = self.ops[pc]
            self.loop_pcs[pc] = self.loops
            run.append(pc)
            if op.spec.opens is None:
                stmts.extend(self.lines_of(op))
                pc += 1
                continue
            out.extend(self.straight(run, stmts))
            run, stmts = [], []
            whole = self.whole_block(op)
            if whole is not None:  # the backend rendered the block itself
                out.extend(whole)
                pc = op.match + 1
                continue
            out.extend(self.lines_of(op))
            outer = self.loops
            if op.spec.opens is FrameKind.FOR:
                self.loops = outer + (pc,)
            out.extend(indent(self.block(pc + 1, op.match + 1)))
            self.loops = outer
            out.extend(self.close(op, self.ops[op.match]))
            pc = op.match + 1
        out.extend(self.straight(run, stmts))
        return out or self.empty()

    def whole_block(self, opener) -> list[str] | None:
        """The lines of ``opener``'s whole block (header, body, closer) when the backend
        renders it itself; None (the default): the walk renders it."""
        return None

    def straight(self, run: list[int], stmts: list[str]) -> list[str]:
        """The lines of a straight run of ops (pcs ``run``, rendered as ``stmts``); the run
        ends with the opener whose header follows, if any."""
        return stmts

    def close(self, opener, closer) -> list[str]:
        """The lines after an opener's indented block."""
        return []

    def empty(self) -> list[str]:
        """The lines of a block with nothing in it."""
        return []
