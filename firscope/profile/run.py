"""``firscope run``: decode tokens headlessly, and say how fast (steps per second).

It lives in profile/, the lowest layer that sees everything the command needs:
the machine (runtime/), ``--engine gpu`` (gpu/) and ``--dump`` (compare/).
The progress line of the load and the kernels' compilation is
:class:`~firscope.runtime.progress.TerminalProgress`; ctrl+c stops the run
between nodes (or inside an interpreted kernel) and ends as "interrupted".
"""
from __future__ import annotations

import io
import sys
import time

from ..defaults import DEFAULT_ENGINE, DEFAULT_STEPS
from ..runtime.opening import RunInput
from ..text import printable

__all__ = ["run_decode"]


def run_decode(source: RunInput, *, n: int = DEFAULT_STEPS, engine: str = DEFAULT_ENGINE,
               temperature: float = 0.0, seed: int | None = None, budget: int | None = None,
               logits_out: str | None = None, dump: str | None = None,
               dump_nodes: str | None = None, ids: bool = False) -> int:
    """Decode ``n`` tokens after ``source``'s prompt and print the text (``ids``: the token
    ids); ``logits_out``: every step's logits as float32 [steps, vocab] .npy; ``dump``:
    every node output (``dump_nodes``: only these)."""
    import numpy as np

    from ..compare.command import dump_recording
    from ..engines import engine_spec, make_machine
    from ..runtime.interrupt import ctrl_c_stops, stop_between_nodes
    from ..runtime.opening import (check_budget, check_distinct_outputs,
                                   check_npy_replaceable, check_output_file, write_output)
    from ..runtime.progress import TerminalProgress
    check_distinct_outputs(("--dump", dump), ("--logits-out", logits_out))
    budget = check_budget(budget)
    if logits_out is not None:  # before the run, not after it
        check_output_file(logits_out, "--logits-out")
        check_npy_replaceable(logits_out, "--logits-out")
    shown = TerminalProgress()
    opened = source.open(progress=shown)
    prompt, tok = list(opened.ids), opened.tokenizer
    machine = make_machine(opened.model, engine, budget=budget)
    if machine.kernel_runner is not None:  # compiled now, where the progress line shows it
        machine.kernel_runner.warmup(progress=shown)
    shown.done()
    if engine_spec(engine).steps:  # the GPU engine looks at the stop flag between tokens
        stop_between_nodes(machine)
    steps = len(prompt) + max(n - 1, 0)  # the last generated token is not fed
    t = time.perf_counter()
    with ctrl_c_stops(machine.stop_flag), dump_recording(machine, dump, dump_nodes, steps):
        # the prompt's logits only where they are saved: its other steps skip the head
        generated, logits = machine.generate(prompt, n, temperature=temperature, seed=seed,
                                             prompt_logits=logits_out is not None)
    dt = time.perf_counter() - t
    if logits_out is not None:
        buf = io.BytesIO()
        np.save(buf, np.stack(logits).astype(np.float32))
        write_output(logits_out, buf.getvalue(), "the logits")
    if ids or tok.kind == "none":
        print(",".join(str(i) for i in prompt + generated))
    else:  # the tokenizer's text can hold any character: escape what a terminal would act on
        print(printable(tok.decode(prompt + generated), newlines=True))
    print(f"[{steps} steps in {dt:.2f} s, {steps / dt if dt else 0:.1f} steps/s, engine "
          f"{engine}]", file=sys.stderr)
    return 0
