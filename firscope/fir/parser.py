"""Text -> syntax tree for .fir files.

One directive per line, ``#`` comments, whitespace-separated tokens. Every
element of the tree carries the line and column it came from, and every
error is raised where it is found with that position.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import FirError, Loc
from . import syntax as S
from .expr import parse_expr
from .source import read_limited, undecodable_at

_WORD = re.compile(r"\S+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*$")
# A hostile file must not take the machine's memory or minutes to parse:
# parsing holds up to ~250 bytes of objects per byte of text and takes a few
# microseconds per byte, so this limit bounds both (the seed gpt2.fir is 7 KB).
MAX_FILE_BYTES = 1024 * 1024

HEADER_KEYWORDS = ("fir", "model", "config", "runtime", "epsilon", "prefix")


def parse_file(path: str | Path) -> S.FirFile:
    path = Path(path)
    return parse_text(_read_text(path, "a .fir model file"), str(path))


def _read_text(path: Path, what: str) -> str:
    """The file's text: bounded, UTF-8 (a byte that is not is reported at its position)."""
    raw = read_limited(path, what, MAX_FILE_BYTES)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FirError("file is not UTF-8 text", Loc(str(path), *undecodable_at(raw, e))) \
            from None


def source_lines(text: str) -> list[str]:
    """Lines as an editor numbers them: only \n (or \r\n) ends a line.

    str.splitlines() also breaks at form feeds, \x1c-\x1e, \x85 and \u2028,
    which would shift every position reported after such a character.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_text(text: str, path: str = "<string>") -> S.FirFile:
    return _Parser(text, path).parse()


def parse_kernels(path: str | Path) -> tuple[S.Kernel, ...]:
    """A file of ``kernel ... endkernel`` blocks only (an edit of a model's kernels: firscope
    replay --kernel, the debugger's ``kernel edit``); positions are the file's."""
    path = Path(path)
    p = _Parser(_read_text(path, "a kernel file"), str(path))
    out = []
    while (line := p.next_line()) is not None:
        if line.toks[0].text != "kernel":
            raise FirError(f"only 'kernel ... endkernel' blocks belong in a kernel file, found "
                           f"'{line.toks[0].text}'", line.toks[0].loc)
        out.append(p.directive(line, in_repeat=False))
    if not out:
        raise FirError("the file holds no 'kernel ... endkernel' block",
                       Loc(str(path), 1, 1, p.raw_lines[0] if p.raw_lines else ""))
    return tuple(out)


class _Line:
    """One source line split into tokens with their columns (comment removed)."""

    def __init__(self, path: str, number: int, text: str):
        self.path = path
        self.number = number
        self.text = text
        code = text.split("#", 1)[0]
        self.toks = [S.Tok(m.group(), Loc(path, number, m.start() + 1, text))
                     for m in _WORD.finditer(code)]
        self.code = code

    def loc(self, col: int = 1) -> Loc:
        return Loc(self.path, self.number, col, self.text)

    def end_loc(self) -> Loc:
        return self.loc(len(self.code.rstrip()) + 1)

    def rest_after(self, tok: S.Tok) -> tuple[str, Loc]:
        """The raw text after ``tok`` (for expressions that may contain spaces)."""
        start = tok.loc.col - 1 + len(tok.text)
        rest = self.code[start:]
        stripped = len(rest) - len(rest.lstrip())
        return rest.strip(), self.loc(start + stripped + 1)


class _Parser:
    def __init__(self, text: str, path: str):
        self.path = path
        self.raw_lines = source_lines(text)
        self.i = 0

    # -- helpers ---------------------------------------------------------
    def next_line(self) -> _Line | None:
        # Lines are split into tokens only when reached, so a huge file that
        # fails early never holds a token object per line of it.
        while self.i < len(self.raw_lines):
            line = _Line(self.path, self.i + 1, self.raw_lines[self.i])
            self.i += 1
            if line.toks:
                return line
        return None

    def expr_from(self, line: _Line, tok: S.Tok):
        return parse_expr(tok.text, tok.loc)

    def want(self, line: _Line, n: int, usage: str, at_least: bool = False) -> None:
        count = len(line.toks)
        if count == n or (at_least and count > n):
            return
        where = line.toks[n].loc if count > n else line.end_loc()
        what = "too many operands" if count > n else "missing operands"
        raise FirError(f"{what} for '{line.toks[0].text}': expected `{usage}`", where)

    def ident(self, tok: S.Tok, what: str) -> S.Tok:
        if not _IDENT.match(tok.text):
            raise FirError(f"bad {what} {tok.text!r}", tok.loc)
        return tok

    # -- file ------------------------------------------------------------
    def parse(self) -> S.FirFile:
        directives: list[S.Directive] = []
        while (line := self.next_line()) is not None:
            directives.append(self.directive(line, in_repeat=False))
        if not any(isinstance(d, S.Version) for d in directives):
            loc = Loc(self.path, 1, 1, self.raw_lines[0] if self.raw_lines else "")
            hint = None
            if len(self.raw_lines) <= 2 and any(len(t) > 300 for t in self.raw_lines):
                hint = ("the file is one very long line: its line breaks may have been lost "
                        "(one directive per line is required)")
            raise FirError("missing 'fir 1' header", loc, hint)
        return S.FirFile(self.path, tuple(self.raw_lines), tuple(directives))

    def directive(self, line: _Line, in_repeat: bool) -> S.Directive:
        head = line.toks[0]
        kw = head.text
        method = getattr(self, "d_" + kw, None) if kw.isidentifier() else None
        if method is None:
            if kw in ("endkernel", "endrepeat", "forend", "ifend"):
                raise FirError(f"'{kw}' without a matching opening directive", head.loc)
            raise FirError(f"unknown directive '{kw}'", head.loc)
        if in_repeat and kw != "node":
            raise FirError(f"'{kw}' is not allowed inside 'repeat' (only 'node')", head.loc)
        return method(line)

    # -- header ----------------------------------------------------------
    def d_fir(self, line):
        self.want(line, 2, "fir 1")
        v = line.toks[1]
        if v.text != "1":
            raise FirError(f"unsupported format version {v.text!r} (firscope reads 'fir 1')", v.loc)
        return S.Version(line.toks[0].loc, v)

    def d_model(self, line):
        self.want(line, 2, "model NAME")
        return S.ModelName(line.toks[0].loc, line.toks[1])

    def d_config(self, line):
        self.want(line, 2, "config FILE.json")
        return S.ConfigPath(line.toks[0].loc, line.toks[1])

    def d_runtime(self, line):
        self.want(line, 2, "runtime graph")
        kind = line.toks[1]
        if kind.text != "graph":
            raise FirError(f"unknown runtime {kind.text!r} (only 'graph' exists)", kind.loc)
        return S.RuntimeKind(line.toks[0].loc, kind)

    def d_epsilon(self, line):
        self.want(line, 2, "epsilon CONFIG_KEY")
        return S.Epsilon(line.toks[0].loc, line.toks[1])

    def d_prefix(self, line):
        self.want(line, 2, "prefix TENSOR_PREFIX")
        return S.Prefix(line.toks[0].loc, line.toks[1])

    def d_require(self, line):
        toks = line.toks
        if len(toks) < 2 or toks[1].text not in ("config", "sym"):
            where = toks[1].loc if len(toks) > 1 else line.end_loc()
            raise FirError("expected 'require config KEY VALUE' or 'require sym EXPR = EXPR'", where)
        if toks[1].text == "config":
            self.want(line, 4, "require config KEY VALUE")
            return S.RequireConfig(toks[0].loc, toks[2], toks[3])
        text, loc = line.rest_after(toks[1])
        parts = _split_equals(text)
        if parts is None:
            raise FirError("expected 'require sym EXPR = EXPR' with one '='", loc)
        (lt, lo), (rt, ro) = parts
        return S.RequireSym(toks[0].loc, parse_expr(lt, loc.shifted(lo)),
                            parse_expr(rt, loc.shifted(ro)))

    def d_sym(self, line):
        toks = line.toks
        if len(toks) < 4 or toks[2].text != "=":
            where = toks[2].loc if len(toks) > 2 else line.end_loc()
            raise FirError("expected 'sym NAME = EXPR'", where)
        name = self.ident(toks[1], "symbol name")
        if "." in name.text:
            raise FirError(f"bad symbol name {name.text!r}", name.loc)
        text, loc = line.rest_after(toks[2])
        return S.Sym(toks[0].loc, name, parse_expr(text, loc))

    def d_buf(self, line):
        toks = line.toks
        self.want(line, 4, "buf NAME f32 SIZE [per_layer] [input:KEY] [output:KEY]", at_least=True)
        name = self.ident(toks[1], "buffer name")
        if toks[2].text != "f32":
            raise FirError(f"unsupported buffer dtype {toks[2].text!r} (buffers are f32)", toks[2].loc)
        per_layer, inp, out = False, None, None
        for flag in toks[4:]:
            if flag.text == "per_layer" and not per_layer:
                per_layer = True
            elif flag.text.startswith("input:") and inp is None and len(flag.text) > 6:
                inp = S.Tok(flag.text[6:], flag.loc.shifted(6))
            elif flag.text.startswith("output:") and out is None and len(flag.text) > 7:
                out = S.Tok(flag.text[7:], flag.loc.shifted(7))
            else:
                raise FirError(f"unknown or repeated buffer flag {flag.text!r} "
                               "(per_layer, input:KEY, output:KEY)", flag.loc)
        return S.Buf(toks[0].loc, name, toks[2], parse_expr(toks[3].text, toks[3].loc),
                     per_layer, inp, out)

    def d_weight(self, line):
        toks = line.toks
        usage = "weight NAME f32|q4|q4:gN SOURCE tensor [SHAPE] [except LAYERS:DTYPE ...]"
        self.want(line, 5, usage, at_least=True)
        name = self.ident(toks[1], "weight name")
        _check_dtype(toks[2])
        if toks[4].text != "tensor":
            raise FirError(f"expected 'tensor' after the source name, found {toks[4].text!r}",
                           toks[4].loc)
        if len(toks) < 6:
            raise FirError("missing shape, e.g. [n_embd,3*n_embd]", line.end_loc())
        at = next((i for i in range(5, len(toks)) if toks[i].text == "except"), None)
        exceptions = ()
        if at is not None:
            exceptions = _parse_exceptions(toks[at], toks[at + 1:])
            text, loc = line.rest_after(toks[4])
            text = text[: toks[at].loc.col - loc.col].rstrip()
            if not text:
                raise FirError("missing shape, e.g. [n_embd,3*n_embd]", toks[at].loc)
        else:
            text, loc = line.rest_after(toks[4])
        if not (text.startswith("[") and text.endswith("]")):
            raise FirError("shape must be written [DIM,DIM,...]", loc)
        dims = []
        for piece, off in _split_commas(text[1:-1]):
            if not piece.strip():
                raise FirError("empty dimension in shape", loc.shifted(1 + off))
            lead = len(piece) - len(piece.lstrip())
            dims.append(parse_expr(piece.strip(), loc.shifted(1 + off + lead)))
        return S.Weight(toks[0].loc, name, toks[2], toks[3], tuple(dims), exceptions)

    # -- kernels ---------------------------------------------------------
    def d_kernel(self, line):
        toks = line.toks
        if len(toks) < 2:
            raise FirError("expected 'kernel NAME in=N out=M threads=EXPR tg=N tgbytes=N'",
                           line.end_loc())
        name = self.ident(toks[1], "kernel name")
        fields: dict[str, S.Tok] = {}
        for tok in toks[2:]:
            key, eq, value = tok.text.partition("=")
            if not eq or not value:
                raise FirError(f"expected KEY=VALUE in kernel header, found {tok.text!r}", tok.loc)
            if key not in ("in", "out", "size", "threads", "tg", "tgbytes", "expect"):
                raise FirError(f"unknown kernel field '{key}'", tok.loc)
            if key in fields:
                raise FirError(f"kernel field '{key}' given twice", tok.loc)
            fields[key] = S.Tok(value, tok.loc.shifted(len(key) + 1))
        for key in ("in", "out", "threads", "tg", "tgbytes"):
            if key not in fields:
                raise FirError(f"kernel '{name.text}' lacks '{key}='", line.end_loc())
        counts = {}
        for key in ("in", "out"):
            tok = fields[key]
            if not (tok.text.isascii() and tok.text.isdigit()) or int(tok.text) > 64:
                raise FirError(f"'{key}=' must be a small non-negative integer", tok.loc)
            counts[key] = int(tok.text)
        size_groups: tuple[S.Tok, ...] = ()
        if "size" in fields:
            size_groups = tuple(S.Tok(p, fields["size"].loc.shifted(off))
                                for p, off in _split_commas(fields["size"].text))
        expects = []
        if "expect" in fields:
            for piece, off in _split_commas(fields["expect"].text):
                loc = fields["expect"].loc.shifted(off)
                op, colon, ex = piece.partition(":")
                if not colon or not ex:
                    raise FirError(f"expected OPERAND:EXPR in expect=, found {piece!r}", loc)
                expects.append((S.Tok(op, loc), parse_expr(ex, loc.shifted(len(op) + 1))))
        body = []
        end = None
        while (inner := self.next_line()) is not None:
            head = inner.toks[0]
            if head.text == "endkernel":
                self.want(inner, 1, "endkernel")
                end = head.loc
                break
            if head.text in ("kernel", "node", "repeat", "endrepeat", "buf", "weight", "sym"):
                raise FirError(f"'{head.text}' inside kernel '{name.text}': missing 'endkernel' "
                               f"for the kernel opened at line {line.number}", head.loc)
            body.append(S.Instr(head, tuple(inner.toks[1:])))
        if end is None:
            raise FirError(f"kernel '{name.text}' has no 'endkernel'", toks[0].loc)
        return S.Kernel(toks[0].loc, name, counts["in"], counts["out"], size_groups,
                        parse_expr(fields["threads"].text, fields["threads"].loc),
                        parse_expr(fields["tg"].text, fields["tg"].loc),
                        parse_expr(fields["tgbytes"].text, fields["tgbytes"].loc),
                        tuple(expects), tuple(body), end)

    # -- graph -----------------------------------------------------------
    def d_node(self, line):
        toks = line.toks
        usage = "node NAME ext|micro OP ARGS... -> OUTS..."
        if len(toks) < 4:
            raise FirError(f"expected `{usage}`", line.end_loc())
        name = self.ident(toks[1], "node name")
        if "@" in name.text:
            raise FirError("node names may not contain '@'", name.loc)
        kind = toks[2]
        if kind.text not in tuple(S.NodeKind):
            raise FirError(f"node kind must be 'ext' or 'micro', found {kind.text!r}", kind.loc)
        arrows = [i for i, t in enumerate(toks) if t.text == "->"]
        if len(arrows) != 1:
            where = toks[arrows[1]].loc if len(arrows) > 1 else line.end_loc()
            raise FirError(f"a node needs exactly one '->' before its outputs: `{usage}`", where)
        a = arrows[0]
        if a < 4:
            raise FirError("a node needs an op or kernel name before '->'", toks[a].loc)
        outs = tuple(toks[a + 1:])
        if not outs:
            raise FirError("a node needs at least one output after '->'", line.end_loc())
        return S.Node(toks[0].loc, name, kind, toks[3], tuple(toks[4:a]), outs)

    def d_repeat(self, line):
        self.want(line, 2, "repeat EXPR")
        count = parse_expr(line.toks[1].text, line.toks[1].loc)
        body = []
        end = None
        while (inner := self.next_line()) is not None:
            head = inner.toks[0]
            if head.text == "endrepeat":
                self.want(inner, 1, "endrepeat")
                end = head.loc
                break
            if head.text == "repeat":
                raise FirError("nested 'repeat' is not supported", head.loc)
            if head.text != "node":
                if head.text in ("kernel", "buf", "weight", "sym", "require"):
                    raise FirError(f"'{head.text}' inside 'repeat': missing 'endrepeat' for the "
                                   f"repeat opened at line {line.number}", head.loc)
            body.append(self.directive(inner, in_repeat=True))
        if end is None:
            raise FirError("'repeat' has no 'endrepeat'", line.toks[0].loc)
        return S.Repeat(line.toks[0].loc, count, tuple(body), end)


DTYPES_TEXT = "f32, q4 or q4:gN with N 2..4096"


def _check_dtype(tok: S.Tok) -> None:
    if S.weight_dtype(tok.text) is None:
        raise FirError(f"unknown weight dtype {tok.text!r} ({DTYPES_TEXT})", tok.loc)


def _parse_exceptions(keyword: S.Tok, groups: list[S.Tok]) -> tuple[S.WeightException, ...]:
    """``except 0,11:f32 4-6:q4:g16``: each group is LAYERS:DTYPE, LAYERS numbers or
    ranges joined by commas (whether a layer exists, or is named twice, is checked where
    the number of layers is known: model/decls)."""
    if not groups:
        raise FirError("'except' needs at least one LAYERS:DTYPE group, e.g. except 0,11:f32",
                       keyword.loc.shifted(len(keyword.text) + 1))
    out = []
    for g in groups:
        if ":" not in g.text:
            raise FirError(f"expected LAYERS:DTYPE (e.g. 0,11:f32 or 4-6:q4:g16), found "
                           f"{g.text!r}", g.loc)
        layers_text, dtype_text = g.text.split(":", 1)
        dtype = S.Tok(dtype_text, g.loc.shifted(len(layers_text) + 1))
        _check_dtype(dtype)
        spans = []
        offset = 0
        for piece in layers_text.split(","):
            where = g.loc.shifted(offset)
            lo, sep, hi = piece.partition("-")
            if not (lo.isascii() and lo.isdigit() and (not sep or (hi.isascii() and hi.isdigit()))):
                raise FirError(f"expected a layer number or a range like 4-6, found {piece!r}",
                               where)
            first, last = int(lo), int(hi) if sep else int(lo)
            if last < first:
                raise FirError(f"layer range {piece} runs backwards (write {last}-{first})",
                               where)
            spans.append(S.LayerSpan(first, last, where))
            offset += len(piece) + 1
        out.append(S.WeightException(tuple(spans), dtype))
    return tuple(out)


def _split_commas(text: str) -> list[tuple[str, int]]:
    """Split on commas outside parentheses; return (piece, offset) pairs."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append((text[start:i], start))
            start = i + 1
    pieces.append((text[start:], start))
    return pieces


def _split_equals(text: str):
    if text.count("=") != 1:
        return None
    i = text.index("=")
    left, right = text[:i], text[i + 1:]
    if not left.strip() or not right.strip():
        return None
    ll = len(left) - len(left.lstrip())
    rl = len(right) - len(right.lstrip())
    return (left.strip(), ll), (right.strip(), i + 1 + rl)
