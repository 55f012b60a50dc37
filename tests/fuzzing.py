"""Hostile-input generators shared by tests/test_fuzz.py and benchmarks/fuzz.py.

A mutation is a plain tuple ``(kind, a, b, c)`` of a name and three integers,
so hypothesis can draw and shrink it and the fuzz script can make it from a
seeded ``random.Random``; :func:`mutate_fir` applies a list of them to the
text of a model file deterministically. Checkpoint and config damage work the
same way. :func:`classify` runs one case and says what happened.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np

from firscope.errors import FirError
from firscope.vm.isa import Category
from firscope.vm.opcodes import OPCODES

# Replacement tokens: numbers of every awkward kind, syntax, keywords, garbage.
WEIRD = [
    "0", "1", "-1", "2", "3e9", "-3e9", "1e400", "1e-400", "3e38", "-3e38", "0.5", "1/0",
    str(10**30), "99999999999999999999999999999999", "4294967296", "18446744073709551616",
    "9223372036854775808", "-2147483649", "1e60", "1e61", "1" + "0" * 401, "0x10", "1_000",
    "nan", "inf", "-inf", "1e", ".", "..", "(", ")", "()", "(1", "1)", "@", "@@", "@in0+",
    "@in9", "@out0-1", "@nosuch", "@in0+1e9", "#", "=", "==", "->", "-> ->", ",", ":",
    "[", "]", "[]", "[1,2]", "[0]", "[-1,3]", "[1,,2]", "[" + "1," * 40 + "1]", "{i}",
    "h.{i}.{i}", "in0.size", "out9.size", "in0.nope", "x.size", "R99", "U-1", "R1", "U0",
    "r32", "sqrt(", "sqrt(-1)", "sqrt()", "pi", "eps", "foo(1)", "n_embd*n_embd*n_embd",
    "(" * 300 + "1" + ")" * 300, "-" * 400 + "1", "1" + "+1" * 1200, "sqrt(" * 200 + "4" +
    ")" * 200, "f32", "q4", "f16", "tensor", "per_layer", "input:token", "input:position",
    "output:logits", "input:", "output:x", "threads=1", "threads=3e9", "threads=16777216",
    "in=99", "out=-1", "tg=0", "size=in0,out9", "expect=in0:0", "expect=:", "ext", "micro",
    "fir.linear", "fir.embedding", "fir.linear_t", "fir.nope", "endkernel", "forbegin",
    "forend", "ifbegin", "ifend", "kernel", "node", "repeat", "endrepeat", "buf", "weight",
    "sym", "require", "config", "fir", "model", "\x00", "\x7f", "\u00e9", "\u200b", "\t",
    "\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\r", "\u00b2", "R\u00b2", "\u0661",
    "in\u00b2.size", "in=\u00b2",
    "\ufeff", "\udc80", "\U0001f600", "x" * 70000,
]

LINES = [
    "fir 1", "fir 2", "config config.json", "config /dev/null", "config .", "config ../x.json",
    "repeat 100000", "repeat 3e9", "repeat -1", "repeat layers", "endrepeat", "endkernel",
    "forbegin 1", "forend", "ifbegin 1", "ifend", "loadconstf32 1 3e9",
    "buf big f32 1e12", "buf neg f32 -1", "buf zero f32 0", "buf t f32 1 input:token",
    "buf huge f32 " + str(2**63), "sym big = 10*10*10*10*10*10*10*10*10*10*10*10*10",
    "sym loop = loop", "require sym 1 = 2", "require config n_embd 1e999999999",
    "require config model_type gpt3", "weight w f32 wte.weight tensor [0]",
    "weight w q4 wte.weight tensor [1099511627776,1099511627776]",
    "weight w f32 wte.weight tensor [1099511627776,1099511627776,1099511627776]",
    "kernel k in=0 out=0 threads=16777216 tg=1 tgbytes=0", "node n micro k -> x",
    "node n ext fir.linear x wte -> x", "node n ext fir.embedding token_id qkvw -> x",
    "prefix nope.", "epsilon n_embd", "epsilon model_type", "model " + "m" * 1000,
]

KINDS = ("drop", "dup", "swap", "move", "tok_replace", "tok_drop", "tok_dup", "tok_swap",
         "tok_copy", "number", "char_insert", "char_delete", "char_replace", "truncate",
         "insert_line", "wrap_parens", "join_lines", "split_line")

_TOKEN = re.compile(r"\S+")


KERNEL_KINDS = ("tok_replace", "number", "tok_copy", "tok_swap", "char_replace", "dup", "drop",
                "swap")


def kernel_body_lines(text: str) -> list[int]:
    """Indexes of the lines inside kernel bodies (for mutations that should still load)."""
    out, inside = [], False
    for i, line in enumerate(text.split("\n")):
        word = line.split("#")[0].split()
        if word and word[0] == "kernel":
            inside = True
        elif word and word[0] == "endkernel":
            inside = False
        elif inside and word:
            out.append(i)
    return out


def _number(b: int, c: int) -> str:
    forms = [str(b), str(-b), str(10 ** (b % 40)), f"{b / 1000}", f"{b}e{c % 500}",
             f"{b}e-{c % 500}", str(2 ** (b % 90)), "0", f"{b}*{c}", f"{b}/{c}", f"{b}.{c}",
             f"-{b}*{c}*{b}*{c}", f"{b % 7}"]
    return forms[c % len(forms)]


def _token_spans(line: str) -> list[tuple[int, int]]:
    return [m.span() for m in _TOKEN.finditer(line)]


def mutate_fir(text: str, ops) -> str:
    """Apply mutations ``(kind, a, b, c)`` to a model file's text, one after another."""
    lines = text.split("\n")
    for kind, a, b, c in ops:
        if not lines:
            lines = [""]
        n = len(lines)
        i, j = a % n, b % n
        line = lines[i]
        spans = _token_spans(line)
        if kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(j, line)
        elif kind == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "move":
            lines.insert(j, lines.pop(i))
        elif kind == "insert_line":
            lines.insert(i, LINES[c % len(LINES)])
        elif kind == "truncate":
            flat = "\n".join(lines)
            lines = flat[: (a * 7919 + b) % (len(flat) + 1)].split("\n")
        elif kind == "join_lines":
            if i + 1 < n:
                lines[i: i + 2] = [line + " " + lines[i + 1]]
        elif kind == "split_line":
            if spans:
                s, _ = spans[b % len(spans)]
                lines[i: i + 1] = [line[:s], line[s:]]
        elif kind in ("char_insert", "char_delete", "char_replace"):
            pos = b % (len(line) + 1)
            ch = WEIRD[c % len(WEIRD)][:1] or "x"
            if kind == "char_insert":
                lines[i] = line[:pos] + ch + line[pos:]
            elif kind == "char_delete":
                lines[i] = line[:pos] + line[pos + 1:]
            else:
                lines[i] = line[:pos] + ch + line[pos + 1:]
        elif spans:
            k = b % len(spans)
            s, e = spans[k]
            tok = line[s:e]
            if kind == "tok_replace":
                new = WEIRD[c % len(WEIRD)]
            elif kind == "tok_drop":
                new = ""
            elif kind == "tok_dup":
                new = tok + " " + tok
            elif kind == "tok_copy":  # a token from elsewhere in the file
                other = lines[c % n]
                ospans = _token_spans(other)
                new = other[slice(*ospans[(a + c) % len(ospans)])] if ospans else tok
            elif kind == "tok_swap":
                s2, e2 = spans[c % len(spans)]
                if (s2, e2) == (s, e):
                    new = tok
                else:
                    first, second = sorted([(s, e), (s2, e2)])
                    lines[i] = (line[: first[0]] + line[second[0]: second[1]]
                                + line[first[1]: second[0]] + line[first[0]: first[1]]
                                + line[second[1]:])
                    continue
            elif kind == "number":
                digits = [(s2, e2) for s2, e2 in spans if any(ch.isdigit() for ch in line[s2:e2])]
                if digits:
                    s, e = digits[b % len(digits)]
                    tok = line[s:e]
                    # keep the KEY= prefix or the @operand+ of an address, change the number
                    m = re.search(r"\d[\d.eE+-]*", tok)
                    new = tok[: m.start()] + _number(a, c) + tok[m.end():]
                else:
                    new = _number(a, c)
            elif kind == "wrap_parens":
                depth = (1, 50, 150, 300, 1000)[c % 5]
                new = "(" * depth + tok + ")" * depth
            else:
                raise ValueError(kind)
            lines[i] = line[:s] + new + line[e:]
    return "\n".join(lines)


def token_stream(vocab: list[str], picks) -> str:
    """A model file made of random tokens from ``vocab``: ``picks`` are (token, newline?)."""
    out = []
    for t, nl in picks:
        out.append(vocab[t % len(vocab)])
        out.append("\n" if nl else " ")
    return "".join(out)


def fir_vocabulary(text: str) -> list[str]:
    words = sorted({m.group() for m in _TOKEN.finditer(text)})
    return words + WEIRD[:60]


# -- checkpoint and config damage -------------------------------------------------
CKPT_KINDS = ("truncate", "flip", "set_byte", "header_len", "header_text", "append", "zero")


def damage_safetensors(data: bytes, ops) -> bytes:
    """Corrupt a safetensors file: truncations, bit flips, edits of the length and JSON header."""
    buf = bytearray(data)
    for kind, a, b, c in ops:
        n = len(buf)
        if kind == "truncate":
            del buf[a % (n + 1):]
        elif kind == "flip" and n:
            buf[a % n] ^= 1 << (b % 8)
        elif kind == "set_byte" and n:
            # mostly hit the length prefix and the JSON header, where damage matters most
            pos = a % min(n, 8 + 600) if c % 4 else a % n
            buf[pos] = b % 256
        elif kind == "header_len" and n >= 8:
            choices = [0, 1, 7, 2**63, 2**64 - 1, 100 * 1024 * 1024 + 1, b, n, n - 8, n - 7]
            buf[:8] = struct.pack("<Q", choices[c % len(choices)] % 2**64)
        elif kind == "header_text" and n >= 8:
            (hl,) = struct.unpack("<Q", bytes(buf[:8]))
            if 8 + hl <= n:
                try:
                    header = json.loads(bytes(buf[8: 8 + hl]))
                except (ValueError, RecursionError):
                    continue
                header = _edit_header(header, a, b, c)
                raw = json.dumps(header).encode()
                raw += b" " * ((8 - len(raw) % 8) % 8)
                buf[: 8 + hl] = struct.pack("<Q", len(raw)) + raw
        elif kind == "append":
            buf += bytes((a + k * b) % 256 for k in range(c % 4096))
        elif kind == "zero":
            start = a % (n + 1)
            buf[start: start + c % 4096] = bytes(len(buf[start: start + c % 4096]))
    return bytes(buf)


_HEADER_VALUES = [None, True, 0, -1, 1.5, 2**64, 10**30, "F32", "F99", "", [], {}, [1, 2],
                  [-1, 4], [2**62, 2**62], [0, 0], ["a"], [[1]], "x" * 100, {"a": 1}, [1.5]]


def _edit_header(header, a, b, c):
    if not isinstance(header, dict) or not header:
        return header
    names = sorted(header)
    name = names[a % len(names)]
    entry = header[name]
    v = _HEADER_VALUES[c % len(_HEADER_VALUES)]
    if b % 5 == 0:
        header[name] = v
    elif isinstance(entry, dict):
        field = ("dtype", "shape", "data_offsets", "extra")[b % 4]
        if b % 3 == 0:
            entry.pop(field, None)
        else:
            entry[field] = v
    return header


CONFIG_VALUES = [None, True, False, 0, -1, 1, 3, 7, 1.5, -0.0, 1e-300, 1e300, 10**30, 2**63,
                 -(2**63), "gpt2", "", "12", [], {}, [1], {"a": {"b": 1}}, "x" * 1000]
CONFIG_KINDS = ("delete", "set", "add", "raw_truncate", "raw_char", "raw_replace", "secret")
# A model file can name any file as its config: what a config holds must never be quoted
# in an error beyond a short value. Longer than any value an error may show (40 chars).
SECRET_MARK = "s3cr3t-" * 8
_RAW_JUNK = ["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "[" * 100000, "{", "}",
             "\"", "\\u0000", "\x00", "\udc80", "1.", "tru", "// c", ",", "0" * 20]


def damage_config(text: str, ops) -> str:
    for kind, a, b, c in ops:
        if kind in ("delete", "set", "add"):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                continue
            if not isinstance(data, dict):
                continue
            keys = sorted(data)
            key = keys[a % len(keys)] if keys else "n_embd"
            if kind == "delete":
                data.pop(key, None)
            elif kind == "set":
                data[key] = CONFIG_VALUES[c % len(CONFIG_VALUES)]
            else:
                data[f"k{b}"] = CONFIG_VALUES[c % len(CONFIG_VALUES)]
            text = json.dumps(data, indent=1)
        elif kind == "secret":
            text = _plant_secret(text, a, b, c)
        elif kind == "raw_truncate":
            text = text[: a % (len(text) + 1)]
        elif kind == "raw_char":
            pos = a % (len(text) + 1)
            text = text[:pos] + chr(32 + b % 95) + text[pos + 1:]
        elif kind == "raw_replace":
            # replace a value after a ':' with junk text
            colons = [m.end() for m in re.finditer(":", text)]
            if colons:
                pos = colons[a % len(colons)]
                end = min([p for p in (text.find(",", pos), text.find("}", pos)) if p >= 0],
                          default=len(text))
                text = text[:pos] + " " + _RAW_JUNK[c % len(_RAW_JUNK)] + text[end:]
    return text


def _plant_secret(text: str, a: int, b: int, c: int) -> str:
    """Put SECRET_MARK in a config: as a value, inside an object, or as raw text (not JSON)."""
    if c % 3 == 2:
        pos = a % (len(text) + 1)
        return text[:pos] + SECRET_MARK + text[pos:]
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return text + SECRET_MARK
    if not isinstance(data, dict) or not data:
        return text
    keys = sorted(data)
    data[keys[a % len(keys)]] = SECRET_MARK if c % 3 == 0 else {"token": SECRET_MARK}
    return json.dumps(data, indent=1)


# -- running one case ----------------------------------------------------------------
LOADED, DECODED, FIRERROR, UNLOCATED, ESCAPE = "loaded", "decoded", "firerror", "unlocated", "escape"


def located(err: FirError, fir_path: Path, fir_text: str | None, other_files=()) -> bool:
    """Whether an error says where the problem is.

    An error about the model file needs a Loc in it whose line/col and text
    agree with the file; an error about another file must name that file.
    """
    loc = err.loc
    if loc is not None:
        if loc.path != str(fir_path):
            return any(loc.path == str(p) for p in other_files)
        if fir_text is None:
            return loc.line >= 1 and loc.col >= 1
        lines = fir_text.split("\n")  # lines as an editor counts them: only \n ends one
        if not 1 <= loc.line <= len(lines) + 1 or loc.col < 1:
            return False
        if loc.line <= len(lines) and loc.text and loc.text != lines[loc.line - 1].rstrip("\r"):
            return False
        return True
    msg = err.message
    return any(str(p) in msg or Path(p).name in msg for p in (fir_path, *other_files))


def run_case(fir_path: Path, *, fir_text: str | None, other_files=(), memory_limit=512 << 20,
             budget=50_000, steps=2, tokens=(3, 7), engine="interp", secret=SECRET_MARK):
    """Load (and when that works, decode ``steps`` tokens); return (outcome, detail).

    outcome is DECODED (loaded and ran or ran into a FirError at run time),
    FIRERROR (load refused with a located error), UNLOCATED (a FirError that
    does not say where), or ESCAPE (anything else: the detail is the exception;
    also a run that changed a weight, and an error that quotes ``secret``).
    """
    from firscope.runtime import load_model
    from firscope.runtime import Machine
    try:
        model = load_model(fir_path, memory_limit=memory_limit)
    except FirError as e:
        if secret and secret in str(e):
            return ESCAPE, AssertionError(f"an error quotes a file's content: {str(e)[:300]}")
        if located(e, fir_path, fir_text, other_files):
            return FIRERROR, e
        return UNLOCATED, e
    except Exception as e:  # everything else is a bug: report it
        return ESCAPE, e
    weights = _weight_values(model)
    try:
        machine = Machine(model, engine=engine, budget=budget)
        vocab = model.vocab
        for t in tokens[:steps]:
            if vocab:
                machine.step(t % vocab)
    except FirError as e:
        return _weights_kept(model, weights) or (DECODED, e)
    except Exception as e:
        return ESCAPE, e
    return _weights_kept(model, weights) or (DECODED, None)


def _weight_values(model) -> dict:
    return {name: model.view(r).copy() for name, r in model.regions.items() if r.is_weight}


def _weights_kept(model, before: dict):
    """None when every f32 weight still holds what was loaded (weights are read-only);
    else an ESCAPE naming the weights a run changed."""
    changed = [name for name, values in before.items()
               if not np.array_equal(model.view(model.regions[name]), values, equal_nan=True)]
    if changed:
        return ESCAPE, AssertionError(f"weights changed by running: {', '.join(changed[:5])}")
    return None


def describe(e: BaseException | None) -> str:
    if e is None:
        return "ok"
    return f"{type(e).__name__}: {str(e)[:400]}"


# -- debugger expressions -------------------------------------------------------------
EXPR_ATOMS = ["x", "y", "x@0", "x@1", "empty", "nanv", "1", "0", "-1", "1e308", "1e400", "10**64",
              "2", "0.5", "-0.0", "64", "65", "9" * 30, "x[0]", "x[1:3]", "x[::2]", "x[-1]"]
EXPR_BINOPS = ["+", "-", "*", "/", "//", "%", "**", "<", ">=", "==", "!=", " and ", " or "]
EXPR_FUNCS = ["abs", "max", "min", "sum", "mean", "std", "any", "all", "sqrt", "exp", "log",
              "isnan", "isinf", "isfinite", "argmax", "argmin", "norm", "len", "count_nan",
              "float", "int"]


def build_expr(pick, depth: int = 0) -> str:
    """A well-formed debugger expression; ``pick(n)`` returns a choice in range(n)."""
    kind = pick(9) if depth < 5 else 0
    if kind <= 2:
        return EXPR_ATOMS[pick(len(EXPR_ATOMS))]
    sub = lambda: build_expr(pick, depth + 1)  # noqa: E731
    if kind <= 4:
        return f"({sub()}{EXPR_BINOPS[pick(len(EXPR_BINOPS))]}{sub()})"
    if kind == 5:
        f = EXPR_FUNCS[pick(len(EXPR_FUNCS))]
        return f"{f}({sub()})" if pick(4) else f"{f}({sub()}, {sub()})"
    if kind == 6:
        return ("-", "not ", "+")[pick(3)] + sub()
    if kind == 7:
        return f"x[{sub()}]"
    return f"x[{sub()}:{sub()}:{sub()}]"


# -- random well-formed kernels ---------------------------------------------------------
_KCONST = ["0", "1", "2", "3", "-1", "0.5", "2.5", "64", "65", "3e9", "1e30", "-3e38", "in0.size",
           "out0.size", "in0.size-1", "4294967295", "2147483648"]
# Offsets past the region are refused at load (one here keeps that path tried); the rest
# bind, and their accesses fault or not at run time depending on the index register.
_KOFF = ["", "", "+1", "-1", "+in0.size-1", "+out0.size-1", "+3", "-64", "+1000000"]


def _alu(operands: str) -> list[str]:
    """The table's ALU mnemonics taking ``operands`` (kinds, e.g. "Rd Rs Rs"), in table order
    (the order fixes which kernel a seed gives)."""
    return [m for m, spec in OPCODES.items() if spec.category is Category.ALU
            and " ".join(spec.operands) == operands]


_ALU3 = _alu("Rd Rs Rs")  # add sub mul div cmplt
_ALU2 = _alu("Rd Rs")  # sigmoid exp rsqrt
_ALU_K = _alu("Ud Us K")  # uaddk umulk
_ALU_F = _alu("Rd Rs F")  # mulconst addconst


def random_kernel_lines(pick, depth: int = 0, budget: list | None = None) -> list[str]:
    """A kernel body that always assembles: random instructions, balanced loops and ifs,
    addresses within or beyond the operands; what it does at run time is the test."""
    budget = budget if budget is not None else [40]
    out: list[str] = []
    reg = lambda: str(pick(6) if pick(8) else pick(32))  # noqa: E731 - mostly a few registers
    while budget[0] > 0 and pick(10):
        budget[0] -= 1
        k = pick(14)
        if k == 0:
            out.append(f"rtou {reg()} {reg()}")
        elif k == 1:
            out.append(f"uconst {reg()} {_KCONST[pick(len(_KCONST))].lstrip('-') or '0'}")
        elif k == 2:
            out.append(f"{_ALU_K[pick(len(_ALU_K))]} {reg()} {reg()} "
                       f"{_KCONST[pick(len(_KCONST))].lstrip('-').split('.')[0] or '1'}")
        elif k == 3:
            out.append(f"uadd {reg()} {reg()} {reg()}")
        elif k in (4, 5):
            op = ("uloadf32", "ustoref32")[pick(2)]
            target = ("@in0", "@out0")[pick(2)]
            out.append(f"{op} {reg()} {reg()} {target}{_KOFF[pick(len(_KOFF))]}")
        elif k == 6:
            out.append(f"loadconstf32 {reg()} {_KCONST[pick(len(_KCONST))]}")
        elif k in (7, 8):
            out.append(f"{_ALU3[pick(len(_ALU3))]} {reg()} {reg()} {reg()}")
        elif k == 9:
            out.append(f"{_ALU2[pick(len(_ALU2))]} {reg()} {reg()}")
        elif k == 10:
            out.append(f"{_ALU_F[pick(len(_ALU_F))]} {reg()} {reg()} "
                       f"{_KCONST[pick(len(_KCONST))]}")
        elif k in (11, 12) and depth < 4:
            opener, closer = (("forbegin", "forend"), ("ifbegin", "ifend"))[k - 11]
            out.append(f"{opener} {reg()}")
            out += random_kernel_lines(pick, depth + 1, budget)
            out.append(closer)
    return out


_THREADS = ["1", "4", "0", "out0.size", "in0.size", "out0.size+1", "3"]


def random_kernel_model(seed_text: str, pick) -> str:
    """The seed model plus one random kernel, dispatched between the last layer and the head."""
    body = "\n".join(random_kernel_lines(pick))
    kernel = (f"kernel fz.k in=1 out=1 threads={_THREADS[pick(len(_THREADS))]} tg=1 tgbytes=0\n"
              + (body + "\n" if body else "") + "endkernel\n")
    text = seed_text.replace("node token ext", kernel + "node token ext", 1)
    return text.replace("node final_norm micro", "node fz micro fz.k x -> mix\n"
                        "node final_norm micro", 1)


# -- debugger scripts: inspection must change nothing; reverse then forward is identity --------
_HOSTILE_LOOKS = [
    "print sum(abs(wte, wte))", "print max(wte, 0, x)", "print sum(log(qkvw@0, qkvw@0))",
    "print exp(x, x)", "stats abs(x, x)", "print (1,) * 1000000000", "print len((1,)*100000000)",
    "print max(wte + (wte,)*200000)", "print x[::0]", "print x@" + "9" * 40, "print R99",
    "print int(1e400)", "print ((10**64)**64)**64", "print -" * 3 + "1", "stats (x, 1)",
    "print wte[0:4, 0:1] * x", "print key_cache@1[0:8] > x[0:1]", "print scores@0[0:2]",
    "print sum(x) if 1", "print x.__class__", "print __import__('os')", "lane 99",
    "info lanes R" + "9" * 30, "info bogus", "delete 1 1", "list", "where", "info registers",
    "info node", "info breakpoints", "print argmax(logits)", "print U1 * 4294967295",
]
_PLAIN_LOOKS = ["print x[0:4]", "print max(abs(x))", "stats x", "print R1", "print U2",
                "info lanes U1", "lane 1", "lane 0", "print mean(value_cache@0)", "print pc",
                "print position + layer", "stats wte"]
_MOVES = ["next", "stepi", "stepi 5", "stepi 40", "next 3", "until attention@1", "token",
          "finish", "until g2.attn_decode:156", "continue"]
_REVERSE = ["reverse-stepi", "reverse-stepi 7", "reverse-stepi 60", "reverse-next",
            "reverse-next 4", "reverse-continue"]
_BREAKS = ["break ln2", "tbreak attention@1", "break g2.add:64", "watch x[0:2]",
           "break attention if max(abs(x)) > 0", "break nan", "watch attn[3]"]


def debug_script(pick, length: int = 10) -> tuple[list[str], list[str]]:
    """(movements and breakpoints only, the same interleaved with looks at the state)."""
    moves, looked = [], []
    for _ in range(max(1, pick(length) + 1)):
        r = pick(10)
        if r < 1:
            line = _BREAKS[pick(len(_BREAKS))]
        else:
            line = _MOVES[pick(len(_MOVES))]
        moves.append(line)
        looked.append(line)
        for _ in range(pick(4)):
            pool = _HOSTILE_LOOKS if pick(2) else _PLAIN_LOOKS
            looked.append(pool[pick(len(pool))])
    return moves, looked


def run_debug_script(model, lines, prompt=(3, 7, 5), n=3, engine="interp"):
    """Run a script; every error must be a FirError. Returns (logits bits, arena bits,
    sequence) after a final ``continue`` with breakpoints deleted."""
    import numpy as np

    from firscope.debug import CommandInterpreter, Session
    s = Session(model, [t % model.vocab for t in prompt], n, engine=engine)
    ci = CommandInterpreter(s)
    for line in lines:
        try:
            ci.execute(line)
        except FirError:
            pass
    ci.execute("delete")
    ci.execute("continue")
    logits = np.stack(s.logits).view(np.uint32).copy() if s.logits else None
    return logits, model.arena.view(np.uint32).copy(), list(s.sequence)


def check_read_only(model, pick) -> str | None:
    """None when looking at the state (hostile looks included) changed nothing."""
    import numpy as np
    moves, looked = debug_script(pick)
    a = run_debug_script(model, moves)
    b = run_debug_script(model, looked)
    same = (a[2] == b[2] and np.array_equal(a[1], b[1])
            and (a[0] is None) == (b[0] is None) and (a[0] is None or np.array_equal(a[0], b[0])))
    return None if same else "inspection changed the decode:\n" + "\n".join(looked)


def session_state(s):
    import numpy as np
    d = s.dispatch
    regs = None if d is None else (d.pc, d.steps, d.R.tobytes(), d.U.tobytes(), d.mask.tobytes(),
                                  tuple((str(f.kind), f.pc, f.trips) for f in d.stack))
    return (s.step, s.node_index, s.finished, tuple(s.sequence),
            s.arena.view(np.uint32).tobytes(), regs, tuple(l.tobytes() for l in s.logits))


def check_reverse(model, pick, prompt=(3, 7, 5), n=3) -> str | None:
    """Forward, then back by random reverse movements, then forward to the same place again:
    the state must be bit-identical (None), else a description of the script."""
    from firscope.debug import CommandInterpreter, Session
    s = Session(model, [t % model.vocab for t in prompt], n, engine="interp")
    ci = CommandInterpreter(s)
    script = []
    for _ in range(pick(4) + 1):
        line = _MOVES[pick(len(_MOVES) - 1)]  # not continue: keep some room to go back
        script.append(line)
        ci.execute(line)
    if s.finished:
        return None
    here = (s.step, s.node_index, s.dispatch.steps if s.dispatch else None)
    want = session_state(s)
    back = [_REVERSE[pick(len(_REVERSE))] for _ in range(pick(3) + 1)]
    for line in back:
        script.append(line)
        ci.execute(line)
    # forward again to exactly where we were: node by node, then instruction by instruction
    guard = 0
    while (s.step, s.node_index) != here[:2] and guard < 10_000:
        ci.execute("next")
        guard += 1
    if here[2] is not None:
        ci.execute(f"stepi {here[2]}" if s.dispatch is None else
                   f"stepi {here[2] - s.dispatch.steps}" if here[2] > s.dispatch.steps else
                   "where")
    got = session_state(s)
    if got != want:
        return "reverse then forward changed the state:\n" + "\n".join(script)
    return None


# -- stores aimed at weights -------------------------------------------------------------------
# Addresses a store may name: f32 weights by name, and operands that some node binds to a
# weight (g2.add's in1 for the biases, g2.layernorm's in1/in2), or to a buffer.
_STORE_TARGETS = ["@wte", "@wpe", "@lnfw", "@lnfb", "@ln1w", "@qkvb", "@projb", "@in0", "@in1",
                  "@in2", "@out0", "@x", "@norm", "@qkvw"]


def weight_store_model(seed_text: str, pick) -> str:
    """The seed with 1-3 stores inserted into kernel bodies, mostly aimed at weights.

    Loading must refuse every store that can reach a weight (located at the store);
    a model that loads must leave every weight as loaded (run_case checks this)."""
    lines = seed_text.split("\n")
    for _ in range(1 + pick(3)):
        body = kernel_body_lines("\n".join(lines))
        at = body[pick(len(body))] + pick(2)
        target = _STORE_TARGETS[pick(len(_STORE_TARGETS))] + _KOFF[pick(len(_KOFF))]
        lines.insert(at, f"ustoref32 {pick(16)} {pick(8)} {target}")
    return "\n".join(lines)


# -- the command line: hostile values and output paths (issue 10.7, 10.13) -------------------
# Values for any option: numbers of every awkward kind, text that is not UTF-8 (argv hands
# such bytes on as surrogates), terminal escapes, empty strings, option-looking words.
CLI_VALUES = ["", " ", "0", "1", "2", "-1", "-0", "3", "15", "16", "17", "999999", "1e-320",
              "5e-324", "1e308", "1e400", "nan", "inf", "-inf", "-0.5", "0.7", "1.5", "1_0",
              "0x10", "\u0661", "\u00b2", "9" * 5000, str(2**64), str(-2**63), "1,2", "1,,2",
              ",", "1, 2", "63", "64", "-5,3", "a\udcffb", "\udc80", "\x1b]0;x\x07", "\x9b2J",
              "--", "-n", "--prompt", "hi", "\x00", "é", "\u202e", "x" * 300]
CLI_OPTIONS = {
    "run": ["-n", "--temperature", "--seed", "--tokens", "--prompt", "--budget", "--group",
            "--engine", "--logits-out", "--ids", "--fir-f32"],
    "debug": ["-n", "--tokens", "--prompt", "--group", "--engine", "--keep-going", "-x"],
    "check": ["--group", "--fir-f32"],
    "profile": ["-n", "--tokens", "--prompt", "--engine", "-o"],
}
CLI_FLAGS = {"--ids", "--fir-f32", "--keep-going"}
# Output path kinds; each names what must stay untouched (see cli_output_path).
OUTPUT_KINDS = ("new", "exists", "no_npy", "empty", "folder", "link_to_victim",
                "dangling_link", "missing_parent", "under_a_file", "dev_full", "dev_null",
                "proc", "dot_dot", "control_chars", "not_utf8")


def cli_output_path(kind: str, folder: Path) -> str:
    """An output path of ``kind`` inside ``folder`` (which holds ``victim`` and ``a_file``)."""
    return {
        "new": str(folder / "out.npy"), "exists": str(folder / "a_file"),
        "no_npy": str(folder / "logits"), "empty": "", "folder": str(folder),
        "link_to_victim": str(folder / "link"), "dangling_link": str(folder / "dangling"),
        "missing_parent": str(folder / "no" / "such" / "x.npy"),
        "under_a_file": str(folder / "a_file" / "x.npy"), "dev_full": "/dev/full",
        "dev_null": "/dev/null", "proc": "/proc", "dot_dot": str(folder / "sub" / ".." / "o"),
        "control_chars": str(folder / "o\x1b]0;x\x07"), "not_utf8": str(folder / "o\udcff"),
    }[kind]


def prepare_output_folder(folder: Path) -> None:
    """The scene for output paths: a file that must never change, links, a plain file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "victim").write_text("precious")
    (folder / "a_file").write_text("a file")
    (folder / "sub").mkdir(exist_ok=True)
    for name, target in (("link", folder / "victim"), ("dangling", folder / "nowhere")):
        if not os.path.lexists(folder / name):
            os.symlink(target, folder / name)


def cli_argv(command: str, model: str, picks, folder: Path, script: Path) -> list[str]:
    """A command line from ``picks``: (option index, value index, output kind index) triples."""
    opts = CLI_OPTIONS[command]
    argv = [command, model]
    if command != "check":
        argv += ["--engine", "interp"]
        if not any(opts[i % len(opts)] in ("--tokens", "--prompt") for i, _, _ in picks):
            argv += ["--tokens", "1"]
    for i, v, k in picks:
        opt = opts[i % len(opts)]
        if opt in CLI_FLAGS:
            argv.append(opt)
        elif opt in ("--logits-out", "-o"):
            argv += [opt, cli_output_path(OUTPUT_KINDS[k % len(OUTPUT_KINDS)], folder)]
        elif opt == "-x":
            argv += [opt, str(script) if v % 2 else CLI_VALUES[v % len(CLI_VALUES)]]
        else:
            argv += [opt, CLI_VALUES[v % len(CLI_VALUES)]]
    if command == "profile" and "-o" not in argv:
        argv += ["-o", str(folder / "report")]
    return argv


_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def run_cli_case(argv: list[str], folder: Path, stdin_text: str = "print 1+1\n"):
    """Run ``firscope argv`` in this process; return (outcome, detail).

    FIRERROR: exit 1 with a ``firscope:``/located message, or exit 2 from argparse;
    DECODED: exit 0; ESCAPE: anything else - an exception, "internal error", a raw
    control character on stdout or stderr, the victim file changed, or a file
    created outside the output folder's scene (``logits.npy`` for ``logits``,
    ``/dev/full.npy``).
    """
    import contextlib
    import io
    import sys

    from firscope.cli import main
    out, err = io.StringIO(), io.StringIO()
    before = set(os.listdir(folder))
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin_text)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as e:  # argparse: usage errors (2), --help (0)
                code = e.code
    except BaseException as e:  # noqa: BLE001 - everything is a finding here
        return ESCAPE, e
    finally:
        sys.stdin = old_stdin
    text = out.getvalue() + err.getvalue()
    problems = []
    if "internal error" in text or "Traceback" in text:
        problems.append("internal error")
    if _RAW_CONTROL.search(text):
        problems.append("a raw control character in the output")
    if (folder / "victim").read_text() != "precious":
        problems.append("the victim file behind a link was written")
    new = set(os.listdir(folder)) - before
    stray = sorted(n for n in new if n.endswith(".npy") and n != "out.npy" or n.startswith("."))
    if stray or os.path.exists("/dev/full.npy"):
        problems.append(f"files nobody asked for: {stray or ['/dev/full.npy']}")
    if code not in (0, 1, 2):
        problems.append(f"exit status {code!r}")
    if problems:
        return ESCAPE, RuntimeError(f"{'; '.join(problems)}: {text[-600:]!r}")
    return (DECODED if code == 0 else FIRERROR), None


# -- kernels whose lanes overlap at run time ---------------------------------------------
OVERLAP_BODIES = (
    # read-modify-write: the result depends on the order lanes run in
    ["uloadf32 3 1 @out0+{off}", "mulconst 3 3 {a}", "add 3 3 0", "addconst 3 3 {b}",
     "ustoref32 3 1 @out0+{off}"],
    # stores only: a later lane overwrites an earlier one's values
    ["add 3 3 0", "addconst 3 3 {b}", "ustoref32 3 1 @out0+{off}"],
    # two reads in the lane's slice, one store
    ["uloadf32 3 1 @out0", "uloadf32 6 1 @out0+{off}", "mul 3 3 6", "add 3 3 0",
     "ustoref32 3 1 @out0+{off}"],
)


def overlapping_kernel(pick) -> tuple[str, str]:
    """(kernel text, node line): a valid kernel the compiled engine compiles with run-time
    slice checks, whose lanes walk ``in0[0] * scale + extra`` elements from lane * stride
    (the node binds the position or token buffer as in0), so at some steps they reach
    into the next lane's slice (or past the buffer: a fault in both engines)."""
    threads = (2, 3, 4, 5, 8)[pick(5)]
    stride = 1 + pick(4)
    off = pick(stride)
    body = [line.format(off=f"{off}" if off else "0", a=("0.5", "1.5", "-1")[pick(3)],
                        b=("0.125", "1", "-2.5")[pick(3)])
            for line in OVERLAP_BODIES[pick(len(OVERLAP_BODIES))]]
    body = [b.replace("@out0+0", "@out0") for b in body]
    lines = ["rtou 0 0", f"umulk 1 0 {stride}", "uconst 2 0", "uloadf32 1 2 @in0",
             f"mulconst 1 1 {('1', '0.5', '2')[pick(3)]}", f"addconst 1 1 {pick(4)}",
             "loadconstf32 3 0"]
    loop = ["forbegin 1", *body, "uaddk 1 1 1", "forend"]
    if pick(3) == 0:  # only the lanes below k loop: divergent
        lines += [f"loadconstf32 5 {1 + pick(threads)}", "cmplt 4 0 5", "ifbegin 4", *loop,
                  "ifend"]
    else:
        lines += loop
    kernel = (f"kernel fz.overlap in=1 out=1 threads={threads} tg=1 tgbytes=16\n"
              + "".join(f"{line}\n" for line in lines) + "endkernel\n")
    node = f"node overlap micro fz.overlap {('position', 'token_id')[pick(2)]} -> x"
    return kernel, node


def overlapping_kernel_model(seed_text: str, pick) -> str:
    """The seed model with :func:`overlapping_kernel` run in every layer, after the
    attention residual (what it leaves in x reaches the logits)."""
    kernel, node = overlapping_kernel(pick)
    text = seed_text.replace("node token ext", kernel + "node token ext", 1)
    anchor = "node attention_residual micro g2.add x mix -> x\n"
    return text.replace(anchor, anchor + node + "\n", 1)


SAME, DIFFERENT = "same", "different"


def compare_engines(fir_path: Path, tokens=(3, 7, 1, 5), budget=1_000_000):
    """Decode ``tokens`` node by node on the interpreter and the compiled engine; return
    (SAME, detail) when after every node the arenas agree bit for bit and both engines
    ended with the same error (or none), else (DIFFERENT, what differed). A load error
    is (FIRERROR, error)."""
    import numpy as np

    from firscope.runtime import load_model
    from firscope.runtime import Machine
    try:
        machines = [Machine(load_model(fir_path), engine=e, budget=budget)
                    for e in ("interp", "compiled")]
    except FirError as e:
        return FIRERROR, e
    errors: list = [None, None]
    for t in tokens:
        for m in machines:
            m.begin_token(t % m.model.vocab)
        for node in machines[0].model.nodes:
            for k, m in enumerate(machines):
                try:
                    m.run_node(node)
                except FirError as e:
                    errors[k] = e
            if errors != [None, None]:
                break
            a, b = (m.arena.view(np.uint32) for m in machines)
            if not np.array_equal(a, b):
                return DIFFERENT, f"arenas differ after {node.full_name} (token {t})"
        if errors != [None, None]:
            break
        for m in machines:
            m.finish_token()
    if type(errors[0]) is not type(errors[1]) or str(errors[0]) != str(errors[1]):
        return DIFFERENT, f"interp: {describe(errors[0])}; compiled: {describe(errors[1])}"
    return SAME, (errors[0], machines[1].kernel_runner.fallbacks)


def overlap_case(fir_path: Path, fir_text: str):
    """:func:`compare_engines` in :func:`run_case`'s terms: DECODED when the engines agree
    (detail: the error both raised, or None), ESCAPE when they do not."""
    outcome, detail = compare_engines(fir_path)
    if outcome == SAME:
        return DECODED, detail[0]
    if outcome == FIRERROR:
        return (FIRERROR if located(detail, fir_path, fir_text) else UNLOCATED), detail
    return ESCAPE, AssertionError(f"the engines disagree: {detail}")
