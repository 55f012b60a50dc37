"""Command line: ``firscope [MODEL.fir]`` opens the UI; subcommands work headless.

This module parses arguments and dispatches; opening a model and turning a
prompt into ids live in :mod:`firscope.runtime.opening`, and nothing imports
this module. Exit status: 0 done, 1 an error the user can fix (one clear
message on stderr, never a traceback; FIRSCOPE_DEBUG=1 shows one anyway), 2 a
usage error (argparse style) or a bug in firscope, 130 interrupted (ctrl+c).

Only light modules are imported here: NumPy, numba and the model layer load
inside the commands, where ctrl+c is already turned into exit 130.

size: the argument parsers of all seventeen subcommands live here, because argparse
stops at this module; the commands themselves are a few lines each.
"""
from __future__ import annotations

import _thread
import argparse
import difflib
import gc
import math
import os
import signal
import sys
import threading
import time

from . import __version__
from .defaults import (DEFAULT_ENGINE, DEFAULT_GROUP, DEFAULT_STEPS, ENGINES, SANITIZE_STEPS,
                       STEPPING_ENGINES, UI_STEPS)
from .engines import require_stepping
from .errors import FirError, Interrupted, UsageError
from .text import printable, token_ids, undecodable

SUBCOMMANDS = ("check", "run", "debug", "profile", "sanitize", "ui", "diff", "capture", "cost",
               "dap", "serve", "gpu", "wgsl", "eval", "quant", "replay")
# Commands that stop at instructions (or watch every access): not on a GPU
STEPPING_COMMANDS = ("debug", "ui", "serve", "sanitize")  # they stop inside kernels


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


def budget_arg(text: str) -> int:
    """--budget: 1..10^15 instructions (2^63 overflowed the compiled engine's int64)."""
    try:
        n = int(text) if text.isascii() else 0
    except ValueError:
        n = 0
    if not 1 <= n <= 10 ** 15:
        raise argparse.ArgumentTypeError(f"must be 1..{10 ** 15} instructions (got {text!r})")
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


SANITIZER_TOOLS = ("race", "init", "mem")


def tools_arg(text: str) -> tuple[str, ...]:
    """--tools: a comma-separated subset of race, init, mem."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not names:
        raise argparse.ArgumentTypeError("name at least one of race, init, mem")
    for name in names:
        if name not in SANITIZER_TOOLS:
            raise argparse.ArgumentTypeError(f"unknown tool {name!r} (race, init, mem)")
    return names


def tokens_arg(text: str) -> str:
    """``--tokens 1,2,3``: UTF-8 and well formed (an empty item, ``3,,7``, is a usage error
    naming it); the ids stay text until the model says which are in its vocabulary."""
    text = text_arg(text)
    try:
        token_ids(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
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
    p.add_argument("--group", type=int, default=DEFAULT_GROUP, metavar="G",
                   help=f"q4 group size (default {DEFAULT_GROUP})")
    p.add_argument("--q4-path", choices=("packed", "dequant"), default="packed",
                   help="how q4 linears run: on the packed int4 codes (default), or on f32 "
                        "copies dequantized at load (more memory; for comparison)")


class _Given(argparse.Action):
    """Stores the value and notes that the user gave it (``n_given``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _input_args(p: argparse.ArgumentParser, required: bool, steps: int) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", type=text_arg, help="prompt text, fed one token per step")
    g.add_argument("--tokens", type=tokens_arg, help="prompt as token ids, e.g. 1,2,3")
    p.add_argument("-n", type=count_arg, default=steps, metavar="N", action=_Given,
                   help=f"tokens to generate (default {steps})")


def _engine_arg(p: argparse.ArgumentParser, gpu: bool = True) -> None:
    if not gpu:  # a command that records what the reference executes (cost)
        p.add_argument("--engine", choices=STEPPING_ENGINES, default=DEFAULT_ENGINE,
                       help="how the recorded step runs: compiled (numba, default) or "
                            "interp (the step interpreter, the reference)")
        return
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help="how micro-kernels run: compiled (numba, default), interp (the "
                        "step interpreter, the reference) or gpu (WGSL through wgpu; needs "
                        "firscope[gpu]; not for stepping)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="firscope",
        description="A visual debugger and profiler for .fir models. "
                    "`firscope [MODEL.fir]` opens the terminal UI.")
    p.add_argument("--version", action="version", version=f"firscope {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    _ui_parser(sub)
    _quant_parsers(sub)
    _replay_parser(sub)

    c = sub.add_parser("check", help="load and validate a model; print a summary")
    _model_arg(c)

    _run_parser(sub)

    d = sub.add_parser("debug", help="batch debugger (gdb-style commands from -x or stdin)")
    _model_arg(d)
    _input_args(d, required=False, steps=DEFAULT_STEPS)  # unless --against gives the tokens
    d.add_argument("--against", type=path_arg, metavar="DUMP",
                   help="compare every node with this dump (break diverge, info diff); "
                        "without --prompt/--tokens, feed the dump's tokens")
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
    pr.add_argument("--against", type=path_arg, metavar="DUMP",
                    help="compare the profiled run with this dump (the report's divergence "
                         "section)")
    _engine_arg(pr)
    pr.add_argument("--sanitize", action="store_true",
                    help="also run the kernel sanitizer on the same tokens and list its "
                         "findings in the report")
    _corpus_option(pr, "also score this corpus: the q4 model's eval figures and every q4 "
                       "weight's sensitivity in the report (see firscope quant)")

    pr.add_argument("--device", metavar="NAME",
                    help="also predict each node's time on this GPU (report.json 'gpu', "
                         "gpu_nodes.csv, the speed-of-light table and roofline); with "
                         "--engine gpu, the device the measured times are set beside "
                         "(default: the adapter's own profile, else the devices.toml "
                         "default, else h200)")

    _sanitize_parser(sub)
    _diff_parser(sub)
    _capture_parser(sub)
    _cost_parser(sub)

    _editor_parsers(sub)
    _gpu_parsers(sub)
    return p


def _corpus_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--corpus FILE [--ctx N] [--chunks K]`` of a command that scores a corpus besides."""
    p.add_argument("--corpus", type=path_arg, metavar="FILE", help=what)
    p.add_argument("--ctx", type=count_arg, default=None, metavar="N",
                   help="--corpus: tokens per chunk (default: n_positions, at most 512)")
    p.add_argument("--chunks", type=count_arg, default=None, metavar="K",
                   help="--corpus: score only the first K chunks")


def _ui_parser(sub) -> None:
    ui = sub.add_parser("ui", help="open the terminal UI (the default)")
    ui.add_argument("--against", type=path_arg, metavar="DUMP",
                    help="compare every node with this dump (the Diff tab, break diverge); "
                         "without --prompt/--tokens, feed the dump's tokens")
    ui.add_argument("--isolate", action="store_true",
                    help="with --against: colour each node by its own error (run from the "
                         "dump's inputs), not by what it inherited")
    _model_arg(ui)
    _input_args(ui, required=False, steps=UI_STEPS)
    _engine_arg(ui)
    ui.add_argument("--device", metavar="NAME",
                    help="GPU whose predicted times the Profile tab shows (default: the "
                         "devices.toml default, else h200)")
    _corpus_option(ui, "score this corpus in the background (firscope quant sensitivity) and "
                       "show the ranking in the Profile tab")


def _run_parser(sub) -> None:
    r = sub.add_parser("run", help="decode tokens headlessly",
                       description="Feed the prompt one token per step, then generate N "
                                   "tokens: len(prompt) + max(N - 1, 0) steps (the last "
                                   "generated token is not fed back).")
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
    r.add_argument("--budget", type=budget_arg, default=None, metavar="N",
                   help="instructions one dispatch may run before it counts as runaway")
    r.add_argument("--dump", type=path_arg, metavar="FILE",
                   help="write every node output of every step to FILE (.safetensors or .npz; "
                        "see docs/dump-format.md)")
    r.add_argument("--dump-nodes", metavar="PATTERN",
                   help="only these outputs: globs over instances or INSTANCE/BUFFER, "
                        "comma-separated ('attention@*,*/x')")


def _gpu_parsers(sub) -> None:
    g = sub.add_parser("gpu", help="show the GPU adapter wgpu finds (name, backend, driver, "
                                   "limits); --calibrate measures it into a device profile")
    g.add_argument("--calibrate", action="store_true",
                   help="measure the adapter (launch overhead, read bandwidth, f32 throughput, "
                        "latencies, subgroup size) and write its profile to your devices.toml")
    g.add_argument("--device", metavar="NAME",
                   help="with --calibrate: the profile the figures not measured come from "
                        "(default: the one the adapter's name matches; the host CPU for a "
                        "software adapter)")
    g.add_argument("--key", metavar="NAME",
                   help="with --calibrate: the profile's name (default: from the adapter's)")
    g.add_argument("--quick", action="store_true",
                   help="with --calibrate: smaller runs (seconds, not tens of seconds)")
    w = sub.add_parser("wgsl", help="print the WGSL compute shaders generated for the kernels")
    _model_arg(w)
    w.add_argument("kernel", nargs="?", metavar="KERNEL",
                   help="one kernel, node (attention@2) or ext shader (default: every kernel)")


def _sanitize_parser(sub) -> None:
    sa = sub.add_parser(
        "sanitize", help="find races, uninitialized reads and out-of-bounds accesses in the "
                         "model's kernels (exit 1 if any)",
        description="Run the model with every lane's every memory access checked: racecheck "
                    "(two lanes touch one element and one writes: a GPU runs lanes in any "
                    "order), initcheck (a read of memory nothing has written since the load) "
                    "and memcheck (an access outside its region is reported and skipped, "
                    "loads read 0, the run goes on). Kernels the lane analysis proves "
                    "race-free are not instrumented for races. Ends with 'ERROR SUMMARY: N "
                    "errors'; exit status 1 when N > 0 or a fault no tool covers ended the "
                    "run.")
    _model_arg(sa)
    _input_args(sa, required=False, steps=SANITIZE_STEPS)
    sa.add_argument("--tools", type=tools_arg, default=SANITIZER_TOOLS, metavar="LIST",
                    help="which checks, comma-separated: race, init, mem (default: all)")
    sa.add_argument("--json", action="store_true",
                    help="print the report as JSON (for CI) instead of text")
    _engine_arg(sa)


def _cost_parser(sub) -> None:
    co = sub.add_parser(
        "cost", help="predict what each node would cost on a GPU (speed of light)",
        description="Run one decode step with every lane's instructions and addresses "
                    "recorded, and predict each node's time on a GPU from its work, memory "
                    "traffic (32-byte sectors per warp request), SIMD efficiency and latency "
                    "chain: max(memory, compute, latency) + launch overhead. A prediction, "
                    "not a measurement (docs/cost-model.md). Devices: firscope cost "
                    "--device list; add your own in ~/.config/firscope/devices.toml.")
    _model_arg(co)
    g = co.add_mutually_exclusive_group()
    g.add_argument("--prompt", type=text_arg, help="prompt text (default: the sample prompt)")
    g.add_argument("--tokens", type=tokens_arg, help="prompt as token ids, e.g. 1,2,3")
    co.add_argument("--device", metavar="NAME",
                    help="device profile (default: the devices.toml default, else h200); "
                         "'list' lists them")
    co.add_argument("--at", type=count_arg, metavar="POSITION",
                    help="the position of the step analysed (default: the prompt's last "
                         "token; later positions are fed greedy tokens)")
    co.add_argument("--top", type=count_arg, default=40, metavar="N",
                    help="nodes in the ranked table (default 40; 0: all)")
    co.add_argument("--json", action="store_true", help="print the analysis as JSON (with "
                                                         "--device list: the devices)")
    co.add_argument("--baseline", type=path_arg, metavar="B.fir|SAVED.json",
                    help="compare with this model file (same tokens, position and device) or "
                         "a saved cost --json: per kernel and per node before, after, ratio")
    _engine_arg(co, gpu=False)


def _editor_parsers(sub) -> None:
    dp = sub.add_parser("dap", help="Debug Adapter Protocol server for editors (stdio)")
    dp.add_argument("--port", type=int, default=None, metavar="N",
                    help="listen on 127.0.0.1:N for one client after another instead")
    dp.add_argument("--idle-timeout", type=float, default=10.0, metavar="S", help="with "
                    "--port: close a client silent for its first S seconds (default 10)")

    sv = sub.add_parser("serve", help="the UI in a browser tab (needs firscope[serve])")
    _model_arg(sv)
    _input_args(sv, required=False, steps=UI_STEPS)
    _engine_arg(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sv.add_argument("--max-sessions", type=int, default=1, metavar="N",
                    help="UI processes (browser tabs) served at once (default 1)")


def _capture_parser(sub) -> None:
    cp = sub.add_parser("capture", help="cut one node at one step out as a test case folder",
                        description="firscope capture [MODEL.fir] --node attention@2 --step 5 "
                                    "[--against DUMP] -o case/")
    _model_arg(cp)
    cp.add_argument("--node", required=True, type=text_arg, metavar="INSTANCE",
                    help="the node instance, e.g. attention@2")
    cp.add_argument("--step", type=int, default=0, metavar="S", help="the step (default 0)")
    cp.add_argument("--against", type=path_arg, metavar="DUMP",
                    help="take the node's inputs from this dump (the other run's values)")
    g = cp.add_mutually_exclusive_group()
    g.add_argument("--prompt", type=text_arg, help="prompt text (default: the dump's tokens)")
    g.add_argument("--tokens", type=tokens_arg, help="token ids (default: the dump's tokens)")
    _engine_arg(cp)
    cp.add_argument("-o", "--output", required=True, type=path_arg, metavar="FOLDER",
                    help="the case folder to write (new or empty)")


def _diff_parser(sub) -> None:
    df = sub.add_parser("diff", help="find where another run diverges from the reference",
                        description="firscope diff MODEL.fir --against DUMP, or firscope diff "
                                    "A.fir B.fir. Exit 0: nothing diverges; 1: something "
                                    "diverges or does not match; 2: usage or unreadable file.")
    _model_arg(df)
    df.add_argument("other", nargs="?", type=path_arg, metavar="B.fir",
                    help="a second model to run in lockstep (instead of --against)")
    df.add_argument("--against", type=path_arg, metavar="DUMP",
                    help="a dump (.safetensors or .npz)")
    g = df.add_mutually_exclusive_group()
    g.add_argument("--prompt", type=text_arg, help="prompt text (default: the dump's tokens)")
    g.add_argument("--tokens", type=tokens_arg,
                   help="token ids, e.g. 1,2,3 (default: the dump's tokens)")
    _engine_arg(df)
    df.add_argument("--budget", type=budget_arg, default=None, metavar="N",
                    help="instructions one dispatch may run before it counts as runaway")
    df.add_argument("--rtol", type=float, default=None,
                    help="relative L2 bound per node output (default 1e-4)")
    df.add_argument("--atol", type=float, default=None,
                    help="per-element floor as a fraction of max|reference| (default 1e-3)")
    df.add_argument("--ulp", type=int, default=None,
                    help="strict mode: at most N ULPs per element (instead of --rtol/--atol)")
    df.add_argument("--json", action="store_true", help="print JSON")
    df.add_argument("--per-step", action="store_true", help="one row per step, not per output")
    df.add_argument("--chained", action="store_true",
                    help="--engine gpu: the GPU runs on its own values throughout (default: "
                         "isolate, each GPU node starts from the reference's inputs)")
    df.add_argument("--sanitize", action="store_true",
                    help="--engine gpu: also run the race checker, and say when a race "
                         "explains a divergence")
    df.add_argument("--isolate", action="store_true",
                    help="judge every node on its own: run it from the other run's inputs and "
                         "compare only its outputs (finds every wrong node, not just the first)")


def _corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", type=path_arg,
                   help="the .fir model file, or a folder holding one "
                        "(default: the bundled sample)")
    p.add_argument("--corpus", type=path_arg, required=True, metavar="FILE",
                   help="text to score, tokenized with the model's tokenizer")
    p.add_argument("--ctx", type=count_arg, default=None, metavar="N",
                   help="tokens per chunk (default: the model's n_positions, at most 512)")
    p.add_argument("--chunks", type=count_arg, default=None, metavar="K",
                   help="score only the first K chunks")
    p.add_argument("--second-half", action="store_true",
                   help="score only the second half of each chunk, as llama-perplexity does")
    p.add_argument("--group", type=int, default=DEFAULT_GROUP, metavar="G",
                   help=f"q4 group size of weights declared plain q4 (default {DEFAULT_GROUP})")
    _engine_arg(p, gpu=False)
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    p.add_argument("--workers", type=count_arg, default=None, metavar="N",
                   help="worker processes (default: one per core, at most one per work item)")
    p.add_argument("--cluster", type=cluster_arg, default=None, metavar="ADDRESS",
                   help="run the work items on this Dask distributed scheduler's workers "
                        "(needs firscope[cluster]; every worker needs the model's files at "
                        "the same paths); the same figures bit for bit")


def _replay_parser(sub) -> None:
    rp = sub.add_parser(
        "replay", help="replay edited kernels on the original run's inputs: identical or not, "
                       "faults, and the predicted GPU cost before and after",
        description="FILE holds one or more 'kernel ... endkernel' blocks replacing the "
                    "model's kernels of the same names. Every node that dispatches one runs "
                    "with the original and the edited kernel on the same inputs at every step "
                    "(as diff --isolate). Exit 0 when every output is identical bit for bit, "
                    "1 when any differs or the edit faults, 2 on usage or parse errors "
                    "(positioned in FILE).")
    _model_arg(rp)
    rp.add_argument("--kernel", type=path_arg, required=True, metavar="FILE",
                    help="the edited kernel(s)")
    g = rp.add_mutually_exclusive_group()
    g.add_argument("--node", metavar="NAME",
                   help="only this node instance or glob (ln1@0, attention@*); default: all")
    g.add_argument("--all", action="store_true", help="every node that uses an edited kernel "
                                                      "(the default)")
    _input_args(rp, required=True, steps=0)
    rp.add_argument("--device", metavar="NAME",
                    help="device profile of the cost before/after (default: the devices.toml "
                         "default, else h200)")
    rp.add_argument("--chained", action="store_true",
                    help="also run the whole decode with the edit and report how the logits "
                         "change (max |Δ|, same top-1, mean KLD)")
    rp.add_argument("--json", action="store_true", help="print the report as JSON")
    _engine_arg(rp, gpu=False)


def _quant_parsers(sub) -> None:
    ev = sub.add_parser("eval", help="perplexity and KL divergence of q4 against f32 over a "
                                     "corpus (llama-perplexity's figures)")
    _corpus_args(ev)
    ev.add_argument("-o", dest="out", type=path_arg, metavar="DIR",
                    help="also write eval.json and tokens.csv (every scored token) there")
    q = sub.add_parser("quant", help="quantization workbench: per-weight sensitivity and a "
                                     "mixed-precision plan")
    qs = q.add_subparsers(dest="quant_command", metavar="ACTION", required=True)
    s = qs.add_parser("sensitivity", help="KLD against f32 per q4 weight instance, alone and "
                                          "recovered; activation importance")
    _corpus_args(s)
    s.add_argument("-o", dest="out", type=path_arg, metavar="DIR",
                   help="also write sensitivity.json and a bar chart there")
    s.add_argument("--dtypes", type=dtypes_arg, default=(), metavar="q4:gN[,...]",
                   help="also measure each instance at these q4 group sizes (the gain of "
                        "giving it that dtype alone)")
    s.add_argument("--full", action="store_true",
                   help="run every variant from the first layer (default: from the layer it "
                        "changes, from the base run's records; the figures are the same)")
    pl = qs.add_parser("plan", help="choose f32 or q4 per weight instance within a byte budget "
                                    "or a KLD target, and write the plan as a .fir")
    _corpus_args(pl)
    g = pl.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget", type=bytes_arg, metavar="BYTES",
                   help="bytes for the q4-declared weights as loaded (e.g. 2500000, 2.5MB, 12MiB)")
    g.add_argument("--kld", type=kld_arg, metavar="TARGET",
                   help="the mean KLD against f32 to stay under, with the fewest bytes")
    pl.add_argument("-o", dest="out", type=path_arg, required=True, metavar="NEW.fir",
                    help="the plan's model file (beside the original's config and checkpoint)")
    pl.add_argument("--dtypes", type=dtypes_arg, default=(), metavar="q4:gN[,...]",
                    help="q4 group sizes an instance may take besides its own q4 form and f32 "
                         "(e.g. q4:g16: 1 byte a weight against 0.75 at g32 and 4 as f32)")
    pl.add_argument("--baseline", action="store_true",
                    help="also measure the same bytes made f32 by size alone (largest first)")


_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "kib": 1024,
          "mib": 1024 ** 2, "gib": 1024 ** 3}


def dtypes_arg(text: str) -> tuple[str, ...]:
    """--dtypes: q4 group sizes besides each weight's own, e.g. q4:g16 or q4:g16,q4:g64."""
    from .fir.syntax import weight_dtype
    out = []
    for item in text.split(","):
        item = item.strip()
        parsed = weight_dtype(item)
        if parsed is None or parsed[0] != "q4" or parsed[1] is None:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a q4 group dtype (q4:gN, N from 2 up; f32 and the declared "
                "q4 are always considered)")
        if item not in out:
            out.append(item)
    return tuple(out)


def cluster_arg(text: str) -> str:
    """--cluster: a Dask scheduler's address (checked for reachability when used)."""
    from .quant.cluster import cluster_address
    try:
        return cluster_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def bytes_arg(text: str) -> int:
    t = text.strip().lower().replace("_", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 2500000, 2.5MB, "
                                         "12MiB)") from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte (got {text!r})")
    return int(value)


def kld_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"a KLD target is a finite number >= 0 (got {text!r})")
    return v


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


_RESEND = threading.Lock()
_ACTIVE = [0]  # main() calls running with _CtrlC installed


def _send_sigint_soon() -> None:
    """The lost ctrl+c again, 10 ms later, but only while main() still runs: once it has
    returned (and given the caller its handler back: a program, or a test runner) the
    interrupt it was for is over, and a signal now would land in the caller."""
    time.sleep(0.01)
    with _RESEND:
        if _ACTIVE[0]:
            os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    old_hook = sys.unraisablehook
    old = None
    with _RESEND:  # counted before the handler is in place, so the finally always undoes it
        _ACTIVE[0] += 1
    try:  # a signal can arrive as soon as the handler is in place: it is inside this try
        _CtrlC.pressed = False
        sys.unraisablehook = _CtrlC.unraisable_hook(old_hook)
        old = signal.signal(signal.SIGINT, _CtrlC())
        return _main(argv)
    except KeyboardInterrupt:
        print("firscope: interrupted", file=sys.stderr)
        return 130
    finally:
        with _RESEND:  # no re-sent ctrl+c after this (see _send_sigint_soon)
            _ACTIVE[0] -= 1
        sys.unraisablehook = old_hook
        if old is not None:  # main() called from a program: give it its handler back
            signal.signal(signal.SIGINT, old)


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(with_command(parser, argv))
        if args.command == "ui" and args.model is not None and not os.path.exists(args.model):
            parser.error(f"{printable(args.model)}: no such file")
        if getattr(args, "engine", None) and args.command in STEPPING_COMMANDS:
            require_stepping(args.engine, args.command)
        if getattr(args, "isolate", False) and getattr(args, "chained", False):
            parser.error("--isolate and --chained contradict each other (--engine gpu isolates "
                         "by default)")
        if getattr(args, "isolate", False) and args.command == "ui" and not args.against:
            parser.error("--isolate needs --against DUMP (it judges each node on the dump's "
                         "inputs)")
        return COMMANDS[args.command](args)
    except Interrupted as e:  # ctrl+c during a run: say which kernel and line it was in
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 130
    except UsageError as e:  # a value only the model or corpus could judge
        print(f"firscope: {e}" if e.loc is None else str(e), file=sys.stderr)
        return 2
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
                    q4_path=args.q4_path, prompt=getattr(args, "prompt", None),
                    tokens=getattr(args, "tokens", None))


def cmd_check(args) -> int:
    from .runtime.describe import describe_model
    print(describe_model(_run_input(args).load()))
    return 0


def cmd_run(args) -> int:
    from .profile.run import run_decode
    return run_decode(_run_input(args), n=args.n, engine=args.engine,
                      temperature=args.temperature, seed=args.seed, budget=args.budget,
                      logits_out=args.logits_out, dump=args.dump, dump_nodes=args.dump_nodes,
                      ids=args.ids)


def _steps(args) -> int:
    from .debug.opening import steps_against_dump
    return steps_against_dump(args.n, against=args.against, prompt=args.prompt,
                              tokens=args.tokens, n_given=getattr(args, "n_given", False))


def cmd_ui(args) -> int:
    # No garbage collection until the first stop is drawn (FirscopeApp.gc_paused): the
    # imports, the model and the first layout allocate ~10^6 objects, and the collections
    # they set off walked them again and again (~70-100 ms of a ~1.3 s first stop).
    was_on = gc.isenabled()
    gc.disable()
    try:
        try:
            from .tui.launch import UiArgs, run_app
        except ImportError as e:
            raise FirError(f"the terminal UI is not available: {e}") from None
        return run_app(UiArgs(model=args.model, prompt=args.prompt, tokens=args.tokens, n=args.n,
                              n_given=getattr(args, "n_given", False), fir_f32=args.fir_f32,
                              group=args.group, q4_path=args.q4_path, engine=args.engine,
                              against=args.against, isolate=args.isolate, device=args.device,
                              corpus=args.corpus, ctx=args.ctx, chunks=args.chunks),
                       gc_paused=was_on)
    finally:
        if was_on:
            gc.enable()


def cmd_debug(args) -> int:
    from .debug.batch import run_batch
    return run_batch(_run_input(args), n=_steps(args), engine=args.engine, script=args.script,
                     keep_going=args.keep_going, against=args.against)


def cmd_profile(args) -> int:
    if args.engine == "gpu":
        if args.against or args.sanitize or args.corpus:
            raise FirError("profile --engine gpu times the GPU only: --against, --sanitize "
                           "and --corpus need a reference engine (compare with "
                           "`diff --engine gpu`)")
        from .gpu.commands import run_gpu_profile
        return run_gpu_profile(_run_input(args), n=args.n, out=args.out, device=args.device)
    from .profile.report import run_profile
    corpus = None
    if args.corpus is not None:
        from .quant.commands import EvalOptions
        corpus = EvalOptions(model=args.model, corpus=args.corpus, group=args.group,
                             engine=args.engine, ctx=args.ctx, chunks=args.chunks)
    elif args.ctx is not None or args.chunks is not None:
        raise UsageError("--ctx and --chunks go with --corpus FILE")
    return run_profile(_run_input(args), n=args.n, engine=args.engine, out=args.out,
                       against=args.against, sanitize=args.sanitize, device=args.device,
                       corpus=corpus)


def cmd_diff(args) -> int:
    from .compare.command import DiffOptions, run_diff
    options = DiffOptions(
        _run_input(args), other=args.other, against=args.against, engine=args.engine,
        budget=args.budget, rtol=args.rtol, atol=args.atol, ulp=args.ulp, json=args.json,
        per_step=args.per_step, chained=args.chained, sanitize=args.sanitize,
        isolate=args.isolate)
    if args.engine == "gpu":
        from .gpu.diff import gpu_diff_command
        return gpu_diff_command(options, out=sys.stdout, err=sys.stderr)
    return run_diff(options)


def cmd_dap(args) -> int:
    from .dap.server import serve_stdio, serve_tcp
    return serve_stdio() if args.port is None else serve_tcp(args.port,
                                                             idle_timeout=args.idle_timeout)


def cmd_serve(args) -> int:
    from .dap.serve import ServeOptions, serve
    return serve(ServeOptions(model=args.model, prompt=args.prompt, tokens=args.tokens, n=args.n,
                              fir_f32=args.fir_f32, group=args.group, engine=args.engine,
                              q4_path=args.q4_path, host=args.host, port=args.port,
                              max_sessions=args.max_sessions))


def cmd_sanitize(args) -> int:
    from .sanitize import parse_tools
    from .sanitize.runner import run_sanitize
    return run_sanitize(_run_input(args), n=args.n, engine=args.engine,
                        tools=parse_tools(",".join(args.tools)), as_json=args.json)


def cmd_gpu(args) -> int:
    if args.calibrate:
        from .gpu.calibrate import run_calibrate
        return run_calibrate(device=args.device, key=args.key, quick=args.quick)
    if args.device or args.key or args.quick:
        raise UsageError("--device, --key and --quick go with --calibrate")
    from .gpu.commands import gpu_info
    return gpu_info()


def cmd_wgsl(args) -> int:
    from .gpu.commands import print_wgsl
    return print_wgsl(_run_input(args), args.kernel)


def cmd_capture(args) -> int:
    from .compare.command import CaptureOptions, run_capture
    return run_capture(CaptureOptions(_run_input(args), node=args.node, step=args.step,
                                      output=args.output, against=args.against,
                                      engine=args.engine))


def cmd_cost(args) -> int:
    from .cost.render import run_cost
    return run_cost(_run_input(args), device=args.device, at=args.at, as_json=args.json,
                    top=args.top, engine=args.engine, baseline=args.baseline)


def _eval_options(args):
    from .quant.commands import EvalOptions
    return EvalOptions(model=args.model, corpus=args.corpus, group=args.group,
                       engine=args.engine, ctx=args.ctx, chunks=args.chunks,
                       second_half=args.second_half, as_json=args.json,
                       out=getattr(args, "out", None), workers=args.workers,
                       cluster=args.cluster, dtypes=getattr(args, "dtypes", ()),
                       full=getattr(args, "full", False))


def cmd_replay(args) -> int:
    from .edit.command import ReplayOptions, run_replay
    return run_replay(ReplayOptions(_run_input(args), kernel=args.kernel, node=args.node,
                                    n=args.n, device=args.device, chained=args.chained,
                                    as_json=args.json, engine=args.engine))


def cmd_eval(args) -> int:
    from .quant.commands import run_eval
    return run_eval(_eval_options(args))


def cmd_quant(args) -> int:
    from .quant import planning
    if args.quant_command == "sensitivity":
        return planning.run_sensitivity(_eval_options(args))
    return planning.run_plan(_eval_options(args), budget=args.budget, kld=args.kld,
                             out=args.out, baseline=args.baseline)


COMMANDS = {"replay": cmd_replay, "eval": cmd_eval, "quant": cmd_quant, "check": cmd_check, "run": cmd_run, "ui": cmd_ui, "debug": cmd_debug,
            "profile": cmd_profile, "sanitize": cmd_sanitize, "diff": cmd_diff, "dap": cmd_dap,
            "serve": cmd_serve, "capture": cmd_capture, "cost": cmd_cost, "gpu": cmd_gpu,
            "wgsl": cmd_wgsl}
