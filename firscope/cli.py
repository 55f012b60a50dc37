"""Command line: ``firscope [MODEL.fir]`` opens the UI; subcommands work headless.

Every error the user can cause ends as one clear message on stderr and exit
status 1, never a traceback (set FIRSCOPE_DEBUG=1 to see one anyway).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .errors import FirError, Interrupted

SUBCOMMANDS = ("check", "run", "debug", "profile", "ui", "diff")
DEFAULT_PROMPT = "    if "  # the UI's prompt when none is given


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="the .fir model file (default: the bundled sample)")
    p.add_argument("--fir-f32", action="store_true",
                   help="load q4 weights as f32 instead (for comparison)")
    p.add_argument("--group", type=int, default=32, metavar="G",
                   help="q4 group size (default 32)")


def _input_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", help="prompt text, fed one token per step")
    g.add_argument("--tokens", help="prompt as token ids, e.g. 1,2,3")
    p.add_argument("-n", type=int, default=None, metavar="N", help="tokens to generate")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="firscope",
        description="A visual debugger and profiler for .fir models. "
                    "`firscope [MODEL.fir]` opens the terminal UI.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ui = sub.add_parser("ui", help="open the terminal UI (the default)")
    _model_arg(ui)
    _input_args(ui, required=False)
    ui.add_argument("--engine", choices=("compiled", "interp"), default="compiled")

    c = sub.add_parser("check", help="load and validate a model; print a summary")
    _model_arg(c)

    r = sub.add_parser("run", help="decode tokens headlessly")
    _model_arg(r)
    _input_args(r, required=True)
    r.add_argument("--logits-out", metavar="FILE.npy",
                   help="save the logits of every step as float32 [steps, vocab]")
    r.add_argument("--temperature", type=float, default=0.0,
                   help="sample with this temperature (default: greedy)")
    r.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    r.add_argument("--engine", choices=("compiled", "interp"), default="compiled",
                   help="how micro-kernels run (default: compiled)")
    r.add_argument("--ids", action="store_true", help="print token ids instead of text")
    r.add_argument("--budget", type=int, default=None, metavar="N",
                   help="instructions one dispatch may run before it counts as runaway")
    r.add_argument("--dump", metavar="FILE", help="write every node output of every step to "
                   "FILE (.safetensors or .npz; see docs/dump-format.md)")
    r.add_argument("--dump-nodes", metavar="PATTERN", help="only these outputs: globs over "
                   "instances or INSTANCE/BUFFER, comma-separated ('attention@*,*/x')")

    d = sub.add_parser("debug", help="batch debugger (gdb-style commands from -x or stdin)")
    _model_arg(d)
    _input_args(d, required=False)  # required unless --against gives the dump's tokens
    d.add_argument("-x", dest="script", metavar="SCRIPT", help="read commands from this file")
    d.add_argument("--engine", choices=("compiled", "interp"), default="compiled")
    d.add_argument("--against", metavar="DUMP", help="compare every node with this dump "
                   "(break diverge, info diff)")

    pr = sub.add_parser("profile", help="profile a run and write a report")
    _model_arg(pr)
    _input_args(pr, required=True)
    pr.add_argument("-o", dest="out", required=True, metavar="DIR", help="report folder")
    pr.add_argument("--engine", choices=("compiled", "interp"), default="compiled")
    _diff_parser(sub)
    return p


def _diff_parser(sub) -> None:
    df = sub.add_parser("diff", help="find where another run diverges from the reference",
                        description="firscope diff MODEL.fir --against DUMP, or firscope diff "
                                    "A.fir B.fir. Exit 0: nothing diverges; 1: something "
                                    "diverges or does not match; 2: usage or unreadable file.")
    _model_arg(df)
    df.add_argument("other", nargs="?", metavar="B.fir", help="a second model to run in "
                    "lockstep (instead of --against)")
    df.add_argument("--against", metavar="DUMP", help="a dump (.safetensors or .npz)")
    g = df.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="prompt text (default: the dump's tokens)")
    g.add_argument("--tokens", help="token ids, e.g. 1,2,3 (default: the dump's tokens)")
    df.add_argument("--engine", choices=("compiled", "interp"), default="compiled")
    df.add_argument("--budget", type=int, default=None, metavar="N",
                    help="instructions one dispatch may run before it counts as runaway")
    df.add_argument("--rtol", type=float, default=None, help="relative L2 bound per node "
                    "output (default 1e-4)")
    df.add_argument("--atol", type=float, default=None, help="per-element floor as a "
                    "fraction of max|reference| (default 1e-3)")
    df.add_argument("--ulp", type=int, default=None, help="strict mode: at most N ULPs per "
                    "element (instead of --rtol/--atol)")
    df.add_argument("--json", action="store_true", help="print JSON")
    df.add_argument("--per-step", action="store_true", help="one row per step, not per output")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["ui"] + argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Interrupted as e:  # ctrl+c during a run: say which kernel and line it was in
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 130
    except FirError as e:
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
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
        if os.environ.get("FIRSCOPE_DEBUG"):
            raise
        print(f"firscope: internal error: {type(e).__name__}: {e}\n"
              "  (this is a bug in firscope; run with FIRSCOPE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 2


def resolve_model(arg: str | None) -> Path:
    from .samples import default_model
    if arg is None:
        return default_model()
    path = Path(arg)
    if path.is_dir():
        cand = path / "gpt2.fir"
        if cand.exists():
            return cand
        firs = sorted(path.glob("*.fir"))
        if len(firs) == 1:
            return firs[0]
        raise FirError(f"{path}: a folder; give the .fir file inside it")
    return path


def load(args, progress=None):
    from .runtime import load_model
    if args.group < 1 or args.group > 1 << 20:
        raise FirError(f"--group {args.group}: must be a positive group size")
    return load_model(resolve_model(args.model), fir_f32=args.fir_f32, group=args.group,
                      progress=progress)


def prompt_ids(args, model) -> tuple[list[int], "object"]:
    from .model.tokens import load_tokenizer, parse_token_list
    tok = load_tokenizer(model.folder, model.vocab)
    if getattr(args, "tokens", None):
        ids = parse_token_list(args.tokens)
    elif getattr(args, "prompt", None) is not None:
        ids = tok.encode(args.prompt)
        if not ids:
            raise FirError("--prompt: the prompt encodes to no tokens")
    else:
        ids = tok.encode(DEFAULT_PROMPT)
    for i in ids:
        if not 0 <= i < model.vocab:
            raise FirError(f"token id {i} is outside the vocabulary 0..{model.vocab - 1}")
    return ids, tok


def cmd_check(args) -> int:
    model = load(args)
    print(describe_model(model))
    return 0


def describe_model(model) -> str:
    from .runtime import Model
    assert isinstance(model, Model)
    lines = [f"{model.path}: model '{model.family}', {'f32' if model.fir_f32 else 'q4'} "
             f"linears (group {model.group}), {model.layers} layers, "
             f"loaded in {model.timings.get('total', 0):.2f} s", "", "symbols:"]
    syms = model.symbols
    width = max(len(k) for k in syms) if syms else 0
    for k, v in syms.items():
        shown = str(v.numerator) if getattr(v, "denominator", None) == 1 else f"{float(v):g}"
        lines.append(f"  {k:<{width}} = {shown}")
    lines += ["", "buffers:"]
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
    lines += ["", "weights:"]
    groups: dict[str, list] = {}
    for w in model.weights.values():
        groups.setdefault(w.decl, []).append(w)
    total_w = 0
    for decl, entries in groups.items():
        w = entries[0]
        nbytes = sum(e.nbytes for e in entries)
        total_w += nbytes
        kind = w.stored
        inst = f"x{len(entries)}" if len(entries) > 1 else ""
        lines.append(f"  {decl:<8} {w.dtype:<4} {str(list(w.shape)):<14}{inst:>5}  "
                     f"{nbytes:>12,} B  {kind:<12} {w.tensor if len(entries) == 1 else w.tensor + ' ...'}")
    lines.append(f"  total: {total_w:,} bytes")
    lines += ["", "kernels:"]
    for k in model.kernels.values():
        uses = sum(1 for n in model.nodes if n.kind == "micro" and n.target == k.name)
        lines.append(f"  {k.name:<16} {len(k.ops):>4} instructions  in={k.n_in} out={k.n_out}  "
                     f"line {k.syntax.loc.line}  used by {uses} nodes")
    ext = sum(1 for n in model.nodes if n.kind == "ext")
    lines += ["", f"nodes: {len(model.nodes)} ({len(model.nodes) - ext} micro, {ext} ext)"]
    return "\n".join(lines)


def cmd_run(args) -> int:
    from .runtime import Machine
    from .runtime.machine import DEFAULT_BUDGET
    model = load(args)
    ids, tok = prompt_ids(args, model)
    n = 16 if args.n is None else args.n
    if n < 0:
        raise FirError("-n must be 0 or more")
    if args.temperature < 0 or not np.isfinite(args.temperature):
        raise FirError("--temperature must be a finite number >= 0")
    if args.budget is not None and args.budget < 1:
        raise FirError(f"--budget {args.budget}: must be at least 1 instruction")
    machine = Machine(model, engine=args.engine,
                      budget=args.budget if args.budget is not None else DEFAULT_BUDGET)
    stop_between_nodes(machine)
    t = time.perf_counter()
    from .compare.command import dump_recording
    with ctrl_c_stops(machine.stop_flag), dump_recording(machine, args.dump, args.dump_nodes,
                                                         len(ids) + max(n - 1, 0)):
        generated, logits = machine.generate(ids, n, temperature=args.temperature,
                                             seed=args.seed)
    dt = time.perf_counter() - t
    if args.logits_out:
        out = Path(args.logits_out)
        try:
            np.save(out, np.stack(logits).astype(np.float32))
        except OSError as e:
            raise FirError(f"{out}: cannot write logits: {e.strerror}") from None
    if args.ids or tok.kind == "none":
        print(",".join(str(i) for i in ids + generated))
    else:
        print(tok.decode(ids + generated))
    steps = len(logits)
    print(f"[{steps} steps in {dt:.2f} s, {steps / dt if dt else 0:.1f} steps/s, engine "
          f"{args.engine}]", file=sys.stderr)
    return 0


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
    return run_batch(args)


def cmd_profile(args) -> int:
    from .profile.report import run_profile
    return run_profile(args)


def cmd_diff(args) -> int:
    from .compare.command import run_diff
    return run_diff(args, load=load, prompt_ids=prompt_ids)


COMMANDS = {"check": cmd_check, "run": cmd_run, "ui": cmd_ui, "debug": cmd_debug,
            "profile": cmd_profile, "diff": cmd_diff}
