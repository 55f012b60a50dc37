"""Command line: ``firscope [MODEL.fir]`` opens the UI; subcommands work headless.

This module parses arguments and dispatches; opening a model and turning a
prompt into ids live in :mod:`firscope.runtime.opening`, and nothing imports
this module. Exit status: 0 done, 1 an error the user can fix (one clear
message on stderr, never a traceback; FIRSCOPE_DEBUG=1 shows one anyway), 2 a
usage error (argparse style) or a bug in firscope, 130 interrupted (ctrl+c).

Only light modules are imported here: NumPy, numba and the model layer load
inside the commands, where ctrl+c is already turned into exit 130.
"""
from __future__ import annotations

import _thread
import argparse
import contextlib
import difflib
import math
import os
import signal
import sys
import threading
import time

from . import __version__
from .errors import FirError, Interrupted
from .text import printable, undecodable

SUBCOMMANDS = ("check", "run", "debug", "profile", "ui")
DEFAULT_STEPS = 16  # -n of run, debug and profile
UI_DEFAULT_STEPS = 12  # -n of the UI (tui.app.DEFAULT_N): a short run to step through
ENGINES = ("compiled", "interp")


# -- argument types: a bad value is a usage error (exit 2) before anything is loaded ----------
def count_arg(text: str) -> int:
    """-n, --seed: a whole number, 0 or more (NumPy's generators take seeds >= 0)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {n})")
    return n


def temperature_arg(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(t) or t < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text!r})")
    return t


def text_arg(text: str) -> str:
    """Text that will be encoded: it must be UTF-8 (argv hands other bytes on as surrogates)."""
    bad = undecodable(text)
    if bad is not None:
        raise argparse.ArgumentTypeError(bad)
    return text


def path_arg(text: str) -> str:
    if not text:  # Path("") is the current folder: never what the user meant
        raise argparse.ArgumentTypeError("the path is empty")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot hold a NUL character")
    return text


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse quotes some values with repr() and others raw ("unrecognized arguments")
        super().error(printable(message, newlines=True))


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", type=path_arg,
                   help="the .fir model file, or a folder holding one "
                        "(default: the bundled sample)")
    p.add_argument("--fir-f32", action="store_true",
                   help="load q4 weights as f32 instead (for comparison)")
    p.add_argument("--group", type=int, default=32, metavar="G",
                   help="q4 group size (default 32)")
    p.add_argument("--q4-path", choices=("packed", "dequant"), default="packed",
                   help="how q4 linears run: on the packed int4 codes (default), or on f32 "
                        "copies dequantized at load (more memory; for comparison)")


def _input_args(p: argparse.ArgumentParser, required: bool, steps: int) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", type=text_arg, help="prompt text, fed one token per step")
    g.add_argument("--tokens", type=text_arg, help="prompt as token ids, e.g. 1,2,3")
    p.add_argument("-n", type=count_arg, default=steps, metavar="N",
                   help=f"tokens to generate (default {steps})")


def _engine_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="compiled",
                   help="how micro-kernels run: compiled (numba, default) or interp (the "
                        "step interpreter, the reference)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="firscope",
        description="A visual debugger and profiler for .fir models. "
                    "`firscope [MODEL.fir]` opens the terminal UI.")
    p.add_argument("--version", action="version", version=f"firscope {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ui = sub.add_parser("ui", help="open the terminal UI (the default)")
    _model_arg(ui)
    _input_args(ui, required=False, steps=UI_DEFAULT_STEPS)
    _engine_arg(ui)

    c = sub.add_parser("check", help="load and validate a model; print a summary")
    _model_arg(c)

    r = sub.add_parser("run", help="decode tokens headlessly")
    _model_arg(r)
    _input_args(r, required=True, steps=DEFAULT_STEPS)
    r.add_argument("--logits-out", type=path_arg, metavar="FILE",
                   help="save the logits of every step as float32 [steps, vocab] in NumPy "
                        ".npy format, to exactly this file")
    r.add_argument("--temperature", type=temperature_arg, default=0.0,
                   help="sample with this temperature (default: greedy)")
    r.add_argument("--seed", type=count_arg, default=None, help="random seed for sampling")
    _engine_arg(r)
    r.add_argument("--ids", action="store_true", help="print token ids instead of text")
    r.add_argument("--budget", type=int, default=None, metavar="N",
                   help="instructions one dispatch may run before it counts as runaway")

    d = sub.add_parser("debug", help="batch debugger (gdb-style commands from -x or stdin)")
    _model_arg(d)
    _input_args(d, required=True, steps=DEFAULT_STEPS)
    d.add_argument("-x", dest="script", type=path_arg, metavar="SCRIPT",
                   help="read commands from this file (default: standard input)")
    d.add_argument("--keep-going", action="store_true",
                   help="run the rest of the script after a command fails (the exit "
                        "status is still 1)")
    _engine_arg(d)

    pr = sub.add_parser("profile", help="profile a run and write a report")
    _model_arg(pr)
    _input_args(pr, required=True, steps=DEFAULT_STEPS)
    pr.add_argument("-o", dest="out", type=path_arg, required=True, metavar="DIR",
                    help="report folder")
    _engine_arg(pr)
    return p


def with_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with ``ui`` in front when no subcommand is named.

    A first word that is neither a subcommand nor an existing file is a usage
    error, with a suggestion for a typo (``firscope chek``).
    """
    if not argv:
        return ["ui"]
    first = argv[0]
    if first in SUBCOMMANDS or first in ("-h", "--help", "--version"):
        return argv
    if first.startswith("-") or os.path.exists(first):
        return ["ui"] + argv
    close = difflib.get_close_matches(first, SUBCOMMANDS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"commands: {', '.join(SUBCOMMANDS)}"
    parser.error(f"'{printable(first)}' is neither a command nor an existing file; {hint}")
    raise AssertionError("parser.error exits")


class _CtrlC:
    """Notes that ctrl+c was pressed, then raises KeyboardInterrupt as Python would.

    Installed before NumPy, numba and the model load. An interrupt that lands inside a
    C extension's import can come out as some other error (NumPy reports an ImportError
    "could not import module datetime"), and it must still end as "interrupted"; one
    that lands in a callback Python ignores (a weakref callback of the import system) is
    delivered again instead of being printed as "Exception ignored" and lost."""

    pressed = False

    def __call__(self, signum, frame):
        type(self).pressed = True
        raise KeyboardInterrupt

    @staticmethod
    def unraisable_hook(previous):
        def hook(info):
            if isinstance(info.exc_value, KeyboardInterrupt):
                # Sent again a moment later from another thread (whose start is not waited
                # for): raised in this hook, it would be ignored again.
                _thread.start_new_thread(_send_sigint_soon, ())
                return
            previous(info)
        return hook


def _send_sigint_soon() -> None:
    time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    old_hook = sys.unraisablehook
    old = None
    try:  # a signal can arrive as soon as the handler is in place: it is inside this try
        _CtrlC.pressed = False
        sys.unraisablehook = _CtrlC.unraisable_hook(old_hook)
        old = signal.signal(signal.SIGINT, _CtrlC())
        return _main(argv)
    except KeyboardInterrupt:
        print("firscope: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = old_hook
        if old is not None:  # main() called from a program: give it its handler back
            signal.signal(signal.SIGINT, old)


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(with_command(parser, argv))
        if args.command == "ui" and args.model is not None and not os.path.exists(args.model):
            parser.error(f"{printable(args.model)}: no such file")
        return COMMANDS[args.command](args)
    except Interrupted as e:  # ctrl+c during a run: say which kernel and line it was in
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 130
    except FirError as e:
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # also while NumPy, numba or a model are still loading
        print("firscope: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("firscope: out of memory", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `firscope check | head`: the reader left; stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 1
    except Exception as e:  # a bug in firscope: say so plainly, keep the trace opt-in
        if _CtrlC.pressed or _caused_by_ctrl_c(e):
            print("firscope: interrupted", file=sys.stderr)
            return 130
        if os.environ.get("FIRSCOPE_DEBUG"):
            raise
        print(f"firscope: internal error: {type(e).__name__}: {printable(e, newlines=True)}\n"
              "  (this is a bug in firscope; run with FIRSCOPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 2


def _caused_by_ctrl_c(e: BaseException) -> bool:
    """Python wraps a KeyboardInterrupt raised in some places (``__set_name__`` while a
    class body of NumPy is being imported) in a RuntimeError: it is still ctrl+c."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _run_input(args):
    from .runtime.opening import RunInput
    return RunInput(model=args.model, fir_f32=args.fir_f32, group=args.group,
                    q4_path=args.q4_path,
                    prompt=args.prompt, tokens=args.tokens)


def cmd_check(args) -> int:
    from .runtime.opening import open_model
    print(describe_model(open_model(args.model, fir_f32=args.fir_f32, group=args.group,
                                    q4_path=args.q4_path)))
    return 0


def describe_model(model) -> str:
    """``firscope check``'s summary: symbols, buffers, weights, kernels and nodes."""
    lines = [f"{model.path}: model '{model.family}', {'f32' if model.fir_f32 else 'q4'} "
             f"linears (group {model.group}), {model.layers} layers, "
             f"loaded in {model.timings.get('total', 0):.2f} s"]
    lines += ["", "symbols:", *_symbol_lines(model), "", "buffers:", *_buffer_lines(model),
              "", "weights:", *_weight_lines(model), "", "kernels:", *_kernel_lines(model)]
    ext = sum(1 for n in model.nodes if n.kind == "ext")
    lines += ["", f"nodes: {len(model.nodes)} ({len(model.nodes) - ext} micro, {ext} ext)"]
    # One display line per entry: names from the model and config files are escaped in it.
    return "\n".join(printable(line) for line in lines)


def _symbol_lines(model) -> list[str]:
    syms = model.symbols
    width = max(len(k) for k in syms) if syms else 0
    lines = []
    for k, v in syms.items():
        shown = str(v.numerator) if getattr(v, "denominator", None) == 1 else f"{float(v):g}"
        lines.append(f"  {k:<{width}} = {shown}")
    return lines


def _buffer_lines(model) -> list[str]:
    lines = []
    total_buf = 0
    for b in model.buffers.values():
        inst = model.layers if b.per_layer else 1
        nbytes = b.size * inst * 4
        total_buf += nbytes
        flags = " ".join(f for f in ("per_layer" if b.per_layer else "",
                                     f"input:{b.input_key}" if b.input_key else "",
                                     f"output:{b.output_key}" if b.output_key else "") if f)
        lines.append(f"  {b.name:<14} f32 {b.size:>10}{f' x{inst}' if inst > 1 else '':>5}"
                     f"  {nbytes:>12,} B  {flags}")
    lines.append(f"  arena: {model.arena.size:,} f32 elements = {model.arena.nbytes:,} bytes "
                 f"(buffers {total_buf:,} B, f32 weights {model.arena.nbytes - total_buf:,} B)")
    return lines


def _weight_lines(model) -> list[str]:
    groups: dict[str, list] = {}
    for w in model.weights.values():
        groups.setdefault(w.decl, []).append(w)
    lines = []
    total_w = 0
    for decl, entries in groups.items():
        w = entries[0]
        nbytes = sum(e.nbytes for e in entries)
        total_w += nbytes
        inst = f"x{len(entries)}" if len(entries) > 1 else ""
        lines.append(f"  {decl:<8} {w.dtype:<4} {str(list(w.shape)):<14}{inst:>5}  "
                     f"{nbytes:>12,} B  {w.stored:<12} "
                     f"{w.tensor if len(entries) == 1 else w.tensor + ' ...'}")
    lines.append(f"  total: {total_w:,} bytes")
    return lines


def _kernel_lines(model) -> list[str]:
    lines = []
    for k in model.kernels.values():
        uses = sum(1 for n in model.nodes if n.kind == "micro" and n.target == k.name)
        lines.append(f"  {k.name:<16} {len(k.ops):>4} instructions  in={k.n_in} out={k.n_out}  "
                     f"line {k.syntax.loc.line}  used by {uses} nodes")
    return lines


def cmd_run(args) -> int:
    import io

    import numpy as np

    from .runtime import Machine
    from .runtime.machine import DEFAULT_BUDGET
    from .runtime.opening import check_output_file, write_output
    if args.budget is not None and args.budget < 1:
        raise FirError(f"--budget {args.budget}: must be at least 1 instruction")
    if args.logits_out is not None:  # before the run, not after it
        check_output_file(args.logits_out, "--logits-out")
    shown = TerminalProgress()
    opened = _run_input(args).open(progress=shown)
    ids, tok = list(opened.ids), opened.tokenizer
    machine = Machine(opened.model, engine=args.engine,
                      budget=args.budget if args.budget is not None else DEFAULT_BUDGET)
    if machine.kernel_runner is not None:  # compiled now, where the progress line shows it
        machine.kernel_runner.warmup(progress=shown)
    shown.done()
    stop_between_nodes(machine)
    t = time.perf_counter()
    with ctrl_c_stops(machine.stop_flag):
        generated, logits = machine.generate(ids, args.n, temperature=args.temperature,
                                             seed=args.seed)
    dt = time.perf_counter() - t
    if args.logits_out is not None:
        buf = io.BytesIO()
        np.save(buf, np.stack(logits).astype(np.float32))
        write_output(args.logits_out, buf.getvalue(), "the logits")
    if args.ids or tok.kind == "none":
        print(",".join(str(i) for i in ids + generated))
    else:  # the tokenizer's text can hold any character: escape what a terminal would act on
        print(printable(tok.decode(ids + generated), newlines=True))
    steps = len(logits)
    print(f"[{steps} steps in {dt:.2f} s, {steps / dt if dt else 0:.1f} steps/s, engine "
          f"{args.engine}]", file=sys.stderr)
    return 0


class TerminalProgress:
    """``loading: weights 45%`` or ``compiling g2.attn_decode 50%`` on one line of stderr,
    on a terminal only and once the work has taken half a second: a first run compiles
    its kernels for a few seconds (later runs load them from the cache and show
    nothing)."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = False

    def __call__(self, what: str, frac: float) -> None:
        if self.tty and time.perf_counter() - self.t0 >= 0.5:
            label = what if what.startswith("compil") else f"loading: {what}"
            sys.stderr.write(f"\r\x1b[K{label} {min(max(frac, 0.0), 1.0):4.0%}")
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def stop_between_nodes(machine) -> None:
    """Check the machine's stop flag before every node: kernels poll it while they run,
    but short kernels and ext ops never do, so a run of them would not stop."""
    def check(m, node):
        if m.stop_flag.is_set():
            raise Interrupted(f"stopped by the user before node {node.full_name} "
                              f"(line {node.loc.line})", node.loc)
    machine.hooks.before_node.append(check)


@contextlib.contextmanager
def ctrl_c_stops(stop_flag: threading.Event):
    """While this runs, ctrl+c sets the machine's stop flag instead of raising at once.

    The interpreter and compiled kernels poll the flag, so the run ends with an
    Interrupted error naming the kernel, node and line it was in (exit 130).
    Python runs signal handlers only between bytecodes, which a compiled
    kernel never reaches, so a helper thread also sets the flag from the
    signal wakeup fd. A second ctrl+c raises KeyboardInterrupt as usual.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        stop_flag.set()

    r, w = os.pipe()
    os.set_blocking(w, False)

    def watch():
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:  # write end closed: the run is over
                return
            if signal.SIGINT in data:
                stop_flag.set()

    old_handler = signal.signal(signal.SIGINT, on_sigint)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="firscope-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGINT, old_handler)
        os.close(w)
        watcher.join(timeout=1.0)
        os.close(r)


def cmd_ui(args) -> int:
    try:
        from .tui.app import run_app
    except ImportError as e:
        raise FirError(f"the terminal UI is not available: {e}") from None
    return run_app(args)


def cmd_debug(args) -> int:
    from .debug.batch import run_batch
    return run_batch(_run_input(args), n=args.n, engine=args.engine, script=args.script,
                     keep_going=args.keep_going)


def cmd_profile(args) -> int:
    from .profile.report import run_profile
    return run_profile(_run_input(args), n=args.n, engine=args.engine, out=args.out)


COMMANDS = {"check": cmd_check, "run": cmd_run, "ui": cmd_ui, "debug": cmd_debug,
            "profile": cmd_profile}
