"""Fuzz firscope with hostile inputs; print what happened to every case.

    python benchmarks/fuzz.py --seed 1 --count 5000

Each case is one of: a mutated gpt2.fir (lines and tokens dropped,
duplicated, swapped, corrupted; random and huge numbers), a stream of random
tokens, random bytes or a truncation of the model file, a damaged
model.safetensors, an edited config.json, a kernel with stores aimed at
weights, a debugger expression, a debugger script (movements with hostile
looks at the state interleaved: the decode must be bit-identical to the same
movements without them), a forward/reverse/forward walk (the state must come
back bit for bit), or a command line with hostile option values and output
paths (run in this process: exit 0, 1 or 2 with a clean message, no raw
control characters printed, no file written through a link or beside the path
given), or a kernel whose lanes overlap at run time ("overlap": decoded node
by node on both engines, whose arenas must agree bit for bit after every node,
and whose errors must read the same), a damaged dump ("dumpfile": npz members
encrypted, of unknown compression, with lying .npy headers or metadata,
safetensors headers; or a valid dump rewritten while open, which must be
reported as changed, never a SIGBUS), a pair of output paths for one run
("outpath": the same file through .., a link or a hard link must be refused; no
link, device or non-dump replaced), or bytes sent to a `dap --port` server on
loopback ("daptcp": a stream that is not DAP gets no answer, every connection
is closed by the server, a clean client is served right after), or issue 39's
surfaces (tests/fuzzing_trust.py): a kernel with long loops on the GPU engine
("gpuloop": the reference's value, or a fault saying the driver ended a loop, never
another value; skipped, and said, where no adapter is found), a hostile
devices.toml used for a cost analysis ("devices": a positioned error or only finite
figures and strict JSON), save breakpoints / capture -o / --logits-out aimed at
victims, links, folders, devices and the run's own inputs ("outputs": nothing but
an allowed target changes), or a dap --port session with no, a wrong or the right
token ("dapauth": nothing but initialize is answered without it). A model that loads is decoded for two steps on the interpreter with a
small instruction budget, and must leave every weight as it was loaded (weights
are read-only). The only acceptable failure is firscope's own FirError,
located: in the model file with a line and column, or naming the other file.
Anything else (KeyError, RecursionError, MemoryError, a hang, engines that
disagree...) is an
escape; the first few are printed with their input.

Not part of the test run: tests/test_fuzz.py runs the same generators under
hypothesis with a few hundred examples.
"""
from __future__ import annotations

import argparse
import difflib
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402

import fuzzing as F  # noqa: E402
import fuzzing_io as FIO  # noqa: E402
import fuzzing_trust as FT  # noqa: E402
from conftest import SEED_FIR, write_random_gpt2  # noqa: E402
from firscope.debug.expr import DebugExpr  # noqa: E402
from firscope.errors import FirError  # noqa: E402

# Categories whose cases are not models (their "decoded" outcome means something else).
NOT_MODELS = ("expr", "script", "reverse", "cli", "dumpfile", "outpath", "daptcp", "gpuloop",
              "devices", "outputs", "dapauth")
CATEGORIES = {"fir": 35, "kernel": 12, "program": 10, "store": 6, "tokens": 6, "bytes": 4,
              "ckpt": 13, "config": 12, "expr": 8, "script": 6, "reverse": 6, "cli": 6,
              "overlap": 3, "dumpfile": 10, "outpath": 4, "daptcp": 6, "gpuloop": 4,
              "devices": 8, "outputs": 6, "dapauth": 4}


class StrayWarning(Exception):
    """A Python warning (NumPy's 'Mean of empty slice', 'overflow encountered') that a
    case let through to stderr: output the user did not ask for, outside the session's."""


class Hang(BaseException):
    """Raised by the alarm: a case ran longer than --timeout seconds."""


def _alarm(signum, frame):
    raise Hang()


def random_ops(rng: random.Random, kinds, most: int = 3):
    return [(rng.choice(kinds), rng.randrange(10**6), rng.randrange(10**6), rng.randrange(10**6))
            for _ in range(rng.choice((1, 1, 1, 2, most)))]


EXPR_PIECES = ["x", "y", "x@0", "x@1", "z", "R1", "1", "0", "-1", "1e308", "1e400", "10**64",
               "2", "(", ")", "[", "]", ":", ",", "+", "-", "*", "/", "//", "%", "**", "<", ">=",
               "==", " and ", " or ", "not ", "abs(", "max(", "min(", "sum(", "mean(", "int(",
               "float(", "argmax(", "len(", "sqrt(", "log(", "norm(", "isnan(", "count_nan(",
               "x[", "x[0:", "x[::", "__import__", "'a'", "lambda", ".", "@", "x@99999999999999",
               "True", "[1]", "{}", "if", "9" * 30, "(" * 120, ")" * 120, "-" * 200]


def expr_case(rng: random.Random):
    if rng.random() < 0.5:  # junk from pieces, or a well-formed expression tree
        text = "".join(rng.choice(EXPR_PIECES) for _ in range(rng.randint(1, 12)))
    else:
        text = F.build_expr(rng.randrange)
    arrays = {"x": np.linspace(-2, 2, 8, dtype=np.float32), "y": np.float32(3.0),
              "z": np.zeros(0, dtype=np.float32), "R1": np.array([1, np.nan], np.float32),
              "empty": np.zeros(0, dtype=np.float32), "nanv": np.float32(np.nan)}

    def resolve(name, layer):
        if name not in arrays:
            raise FirError(f"unknown name {name!r}")
        return arrays[name]

    try:
        value = DebugExpr(text).evaluate(resolve)
        str(value)  # showable: no 5000-digit ints
        if isinstance(value, complex):
            raise TypeError("complex result")
    except FirError:
        return F.FIRERROR, None, text
    except Exception as e:
        return F.ESCAPE, e, text
    return F.DECODED, None, text


def debugger_case(cat: str, model, rng: random.Random):
    """A debugger script or a reverse walk on the base model: a FirError is fine, any other
    exception or a state that differs is an escape."""
    pick = rng.randrange
    try:
        if cat == "script":
            problem = F.check_read_only(model, pick)
        else:
            problem = F.check_reverse(model, pick)
    except FirError as e:
        return F.FIRERROR, e, ""
    except Exception as e:
        return F.ESCAPE, e, ""
    if problem:
        return F.ESCAPE, AssertionError(problem.splitlines()[0]), problem
    return F.DECODED, None, ""


def cli_case(rng: random.Random, model: Path, folder: Path, script: Path):
    """The real command line, in this process: hostile option values and output paths."""
    command = rng.choice(["run"] * 6 + ["debug"] * 3 + ["check"] * 2 + ["profile"])
    picks = [(rng.randrange(10**6), rng.randrange(10**6), rng.randrange(10**6))
             for _ in range(rng.randint(1, 4))]
    F.prepare_output_folder(folder)
    argv = F.cli_argv(command, str(model), picks, folder, script)
    outcome, detail = F.run_cli_case(argv, folder)
    return outcome, detail, repr(argv)[:800]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--budget", type=int, default=50_000, help="instructions per dispatch")
    ap.add_argument("--timeout", type=int, default=30, help="seconds before a case is a hang")
    ap.add_argument("--show", type=int, default=5, help="escapes to print in full")
    ap.add_argument("--only", choices=sorted(CATEGORIES), help="one category of cases")
    ap.add_argument("--memory", type=int, default=6 << 30,
                    help="address-space limit in bytes (0: none), so a runaway allocation is "
                         "a MemoryError here instead of the machine's memory")
    ap.add_argument("--keep", metavar="DIR", help="write each escaping input to this folder")
    ap.add_argument("--engine", choices=("interp", "compiled"), default="interp",
                    help="engine for the decode steps (compiled: slow, every new kernel compiles)")
    args = ap.parse_args()

    if args.memory:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="firscope-fuzz-"))
    base = work / "base"
    write_random_gpt2(base, n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab=64)
    seed_text = SEED_FIR.read_text()
    vocab = F.fir_vocabulary(seed_text)
    kernel_lines = F.kernel_body_lines(seed_text)
    ckpt_bytes = (base / "model.safetensors").read_bytes()
    config_text = (base / "config.json").read_text()
    case_dir = work / "case"
    shutil.copytree(base, case_dir)
    from firscope.runtime import load_model
    base_model = load_model(base / "gpt2.fir")  # for the debugger categories
    case_fir, case_ckpt, case_cfg = case_dir / "gpt2.fir", case_dir / "model.safetensors", \
        case_dir / "config.json"
    cli_folder, cli_script = work / "cli-out", work / "cmds.gdb"
    cli_script.write_text("print 1+1\nnext\nbogus\nprint 2\n")
    dumps = FIO.base_dumps(work)
    dap_server = FIO.TcpServer() if args.only in (None, "daptcp", "dapauth") else None
    gpu = None
    if args.only in (None, "gpuloop"):
        try:
            from firscope.gpu import open_device
            gpu = open_device()
        except FirError as e:
            print(f"gpuloop: skipped, no GPU adapter ({e})")
    private, victim = work / "private.txt", work / "victim-dap.txt"
    private.write_text("root:x:0:0:the first line of a private file\n")
    victim.write_text("IMPORTANT\n")
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)

    if args.only in (None, "overlap"):
        # Overlap cases run the compiled engine: compile the seed's kernels once, here, so
        # that a case's time is its own kernel's (a cold numba cache takes over --timeout).
        from firscope.runtime import load_model
        from firscope.runtime import Machine
        Machine(load_model(base / "gpt2.fir"), engine="compiled").kernel_runner.warmup()
    cats, weights = zip(*CATEGORIES.items())
    counts = Counter()
    per_cat = {c: Counter() for c in cats}
    escapes = []
    slowest = (0.0, "")
    t_start = time.perf_counter()
    for n in range(args.count):
        cat = args.only or rng.choices(cats, weights)[0]
        # every case starts from the pristine folder
        case_fir.write_text(seed_text)
        case_ckpt.write_bytes(ckpt_bytes)
        case_cfg.write_text(config_text)
        fir_text: str | None = seed_text
        others = (case_ckpt, case_cfg)
        shown = ""
        t = time.perf_counter()
        signal.alarm(args.timeout)
        # a warning that would reach stderr is an escape
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                if cat == "expr":
                    outcome, detail, shown = expr_case(rng)
                elif cat in ("script", "reverse"):
                    outcome, detail, shown = debugger_case(cat, base_model, rng)
                elif cat == "cli":
                    outcome, detail, shown = cli_case(rng, base / "gpt2.fir", cli_folder,
                                                      cli_script)
                elif cat == "dumpfile":
                    kind = rng.choice(FIO.DUMP_KINDS)
                    outcome, detail = FIO.dump_case(kind, dumps, work / "dumps", rng.randrange)
                    shown = kind
                elif cat == "outpath":
                    outcome, detail = FIO.outputs_case(str(base / "gpt2.fir"),
                                                       work / "pairs", dumps[".npz"],
                                                       rng.randrange)
                    shown = "outpath"
                elif cat == "daptcp":
                    kind = rng.choice(FIO.FRAME_KINDS)
                    outcome, detail = FIO.dap_tcp_case(dap_server, kind, rng.randrange)
                    shown = kind
                elif cat == "gpuloop":
                    if gpu is None:
                        outcome, detail, shown = "skipped", None, "no GPU"
                    else:
                        outcome, detail = FT.gpu_loop_case(gpu, rng.randrange)
                        shown = "gpuloop"
                elif cat == "devices":
                    outcome, detail = FT.devices_case(base_model, work / "devices",
                                                      rng.randrange)
                    shown = (work / "devices" / "devices.toml").read_text()[:600]
                elif cat == "outputs":
                    outcome, detail = FT.outputs_case(work / "outputs", base, rng.randrange)
                    shown = "outputs"
                elif cat == "dapauth":
                    kind = rng.choice(FT.TOKEN_KINDS)
                    outcome, detail = FT.dap_auth_case(dap_server.port, dap_server.token, kind,
                                                       private, victim)
                    shown = kind
                else:
                    if cat == "fir":
                        ops = random_ops(rng, F.KINDS)
                        fir_text = F.mutate_fir(seed_text, ops)
                        case_fir.write_text(fir_text, encoding="utf-8", errors="surrogatepass")
                        diff = difflib.unified_diff(seed_text.splitlines(), fir_text.splitlines(),
                                                    lineterm="", n=0)
                        shown = f"ops {ops}\n" + "\n".join(list(diff)[2:14])
                    elif cat == "kernel":  # one change inside a kernel body: loads, then runs
                        i = rng.choice(kernel_lines)
                        ops = [(rng.choice(F.KERNEL_KINDS), i, rng.randrange(10**6),
                                rng.randrange(10**6))]
                        fir_text = F.mutate_fir(seed_text, ops)
                        case_fir.write_text(fir_text, encoding="utf-8", errors="surrogatepass")
                        diff = difflib.unified_diff(seed_text.splitlines(), fir_text.splitlines(),
                                                    lineterm="", n=0)
                        shown = f"ops {ops}\n" + "\n".join(list(diff)[2:14])
                    elif cat == "program":  # a random well-formed kernel, dispatched
                        fir_text = F.random_kernel_model(seed_text, rng.randrange)
                        case_fir.write_text(fir_text)
                        shown = fir_text[fir_text.index("kernel fz.k"):][:1500]
                    elif cat == "store":  # stores aimed at weights: refused, or weights unchanged
                        fir_text = F.weight_store_model(seed_text, rng.randrange)
                        case_fir.write_text(fir_text)
                        diff = difflib.unified_diff(seed_text.splitlines(), fir_text.splitlines(),
                                                    lineterm="", n=0)
                        shown = "\n".join(list(diff)[2:14])
                    elif cat == "overlap":  # lanes that stray into each other's slices
                        fir_text = F.overlapping_kernel_model(seed_text, rng.randrange)
                        case_fir.write_text(fir_text)
                        shown = fir_text[fir_text.index("kernel fz.overlap"):][:1500]
                    elif cat == "tokens":
                        picks = [(rng.randrange(10**6), rng.random() < 0.2)
                                 for _ in range(rng.randint(1, 120))]
                        fir_text = (("fir 1\n" if rng.random() < 0.7 else "")
                                    + F.token_stream(vocab, picks))
                        case_fir.write_text(fir_text, encoding="utf-8", errors="surrogatepass")
                        shown = fir_text[:600]
                    elif cat == "bytes":
                        raw = seed_text.encode()
                        if rng.random() < 0.5:
                            data = raw[: rng.randrange(len(raw) + 1)]
                        else:
                            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 2000)))
                            if rng.random() < 0.5:
                                data = raw[: rng.randrange(len(raw))] + data
                        case_fir.write_bytes(data)
                        try:
                            fir_text = data.decode("utf-8")
                        except UnicodeDecodeError:
                            fir_text = None
                        shown = repr(data[:300])
                    elif cat == "ckpt":
                        ops = random_ops(rng, F.CKPT_KINDS)
                        case_ckpt.write_bytes(F.damage_safetensors(ckpt_bytes, ops))
                        shown = f"ops {ops}"
                    elif cat == "config":
                        ops = random_ops(rng, F.CONFIG_KINDS)
                        text = F.damage_config(config_text, ops)
                        case_cfg.write_text(text, encoding="utf-8", errors="surrogatepass")
                        shown = f"ops {ops}\n{text[:500]}"
                    if cat == "overlap":  # both engines, compared node by node
                        outcome, detail = F.overlap_case(case_fir, fir_text)
                    else:
                        outcome, detail = F.run_case(case_fir, fir_text=fir_text,
                                                     other_files=others, budget=args.budget,
                                                     engine=args.engine)
            except Hang:
                outcome, detail = F.ESCAPE, Hang(f"no answer within {args.timeout} s")
            finally:
                signal.alarm(0)
        stray = [w for w in said if issubclass(w.category, (RuntimeWarning, UserWarning))]
        if stray and outcome not in (F.ESCAPE, F.UNLOCATED):
            w = stray[0]
            outcome, detail = F.ESCAPE, StrayWarning(
                f"{w.category.__name__} on stderr: {w.message} ({Path(w.filename).name}:"
                f"{w.lineno})")
        dt = time.perf_counter() - t
        if dt > slowest[0]:
            slowest = (dt, f"{cat} case {n}")
        counts[outcome] += 1
        per_cat[cat][outcome] += 1
        if outcome == F.DECODED and cat not in NOT_MODELS:
            counts["ran" if detail is None else "run_error"] += 1
        if outcome in (F.ESCAPE, F.UNLOCATED):
            escapes.append((n, cat, outcome, detail, shown))
            if keep:
                src = case_dir
                dst = keep / f"{outcome}-{n}-{cat}"
                shutil.copytree(src, dst)
                (dst / "detail.txt").write_text(f"{F.describe(detail)}\n\n{shown}\n")
        if (n + 1) % 500 == 0:
            print(f"  ... {n + 1} cases, {len(escapes)} escapes, "
                  f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)

    total = args.count
    loaded = sum(per_cat[c][F.DECODED] for c in cats if c not in NOT_MODELS)
    firerr = counts[F.FIRERROR]
    escaped = counts[F.ESCAPE] + counts[F.UNLOCATED]
    print(f"seed {args.seed}: tried {total} cases in {time.perf_counter() - t_start:.0f} s "
          f"(slowest {slowest[0]:.1f} s: {slowest[1]})")
    print(f"  loaded: {loaded} (decoded 2 steps: {counts['ran']}, stopped by a FirError while "
          f"running: {counts['run_error']})")
    print(f"  refused with a located FirError: {firerr}")
    print(f"  escaped: {escaped} ({counts[F.ESCAPE]} non-FirError exceptions or hangs, "
          f"{counts[F.UNLOCATED]} FirErrors without a position or file name)")
    for c in cats:
        pc = per_cat[c]
        label = {"expr": "evaluated", "script": "identical", "reverse": "identical",
                 "cli": "exit 0", "dumpfile": "read", "outpath": "exit 0",
                 "daptcp": "answered"}.get(c, "loaded")
        print(f"    {c:<7} {sum(pc.values()):>6} tried  {pc[F.DECODED]:>6} {label}  "
              f"{pc[F.FIRERROR]:>6} FirError  {pc[F.ESCAPE] + pc[F.UNLOCATED]:>4} escaped")
    for n, cat, outcome, detail, shown in escapes[: args.show]:
        print(f"\n--- escape in case {n} ({cat}, {outcome}): {F.describe(detail)}")
        print(shown)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
