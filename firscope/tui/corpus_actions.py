"""``firscope ui --corpus FILE``: the quantization sensitivity sweep over a corpus, shown in
the Profile tab when it is done (a mixin of the app).

The sweep (``firscope quant sensitivity --json``) runs in a process of its own: it takes
minutes on a real model and must never hold up stepping, and it shares nothing with the
session (it loads the model itself). The UI shows that it is running, then the ranking;
quitting the UI ends the process.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

from ..text import printable
from .console_view import ConsoleView
from .profile_view import ProfileView


class CorpusActions:
    """Starts the sweep once the first model is loaded; hands its result to the Profile tab."""

    _corpus_proc: subprocess.Popen | None = None
    _corpus_started = False

    def start_corpus(self) -> None:
        opts = self.options
        if opts.corpus is None or self._corpus_started or self.model is None:
            return
        self._corpus_started = True
        pv = self.query_one(ProfileView)
        if self.model.fir_f32:
            pv.set_corpus(None, "loaded with --fir-f32: nothing is quantized")
            return
        cmd = [sys.executable, "-m", "firscope", "quant", "sensitivity", str(self.model_path),
               "--corpus", str(opts.corpus), "--group", str(opts.group), "--json"]
        if opts.corpus_ctx is not None:
            cmd += ["--ctx", str(opts.corpus_ctx)]
        if opts.corpus_chunks is not None:
            cmd += ["--chunks", str(opts.corpus_chunks)]
        pv.set_corpus(None, f"scoring {printable(opts.corpus)} in the background "
                            "(firscope quant sensitivity): the ranking shows here when done")
        threading.Thread(target=self._corpus_worker, args=(cmd,), daemon=True,
                         name="firscope-corpus").start()

    def _corpus_worker(self, cmd: list[str]) -> None:
        try:
            proc = self._corpus_proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                text=True)
            out, err = proc.communicate()
        except OSError as e:
            self.call_from_thread(self._corpus_failed, f"cannot start it: {e}")
            return
        if proc.returncode == 0:
            try:
                doc = json.loads(out)
            except ValueError as e:
                self.call_from_thread(self._corpus_failed, f"unreadable output: {e}")
                return
            self.call_from_thread(self._corpus_done, doc)
        elif proc.returncode > 0:  # killed (the UI quit) is negative: nothing to say
            lines = [x for x in err.strip().splitlines() if x.strip()]
            self.call_from_thread(self._corpus_failed, lines[-1] if lines else
                                  f"exit status {proc.returncode}")

    def _corpus_done(self, doc: dict) -> None:
        pv = self.query_one(ProfileView)
        pv.set_corpus(doc, None)
        if self.view is not None:
            pv.show(self.model, self.view)
        s = doc["all_q4"]
        self.query_one(ConsoleView).write(
            f"corpus: mean KLD(f32‖q4) {s['kld_mean']:.4g} over {s['tokens']} tokens; "
            f"sensitivity of {len(doc['weights'])} weights in the Profile tab")

    def _corpus_failed(self, why: str) -> None:
        self.query_one(ProfileView).set_corpus(None, f"corpus: {why}")
        self.notify(f"corpus sensitivity failed: {why}", severity="error", timeout=10)
        if self.view is not None:
            self.query_one(ProfileView).show(self.model, self.view)

    def on_unmount(self) -> None:
        proc = self._corpus_proc
        if proc is not None and proc.poll() is None:
            proc.kill()
