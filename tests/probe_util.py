"""The trust rounds' probe models: the sample plus one kernel ``t.s`` and one node
``node probe micro t.s x -> mix`` right after ``embeddings`` (issue 39's reproducers)."""
from __future__ import annotations

import shutil
from pathlib import Path

from conftest import SAMPLE


def probe_model(folder: Path, body: list[str], *, threads: int = 1, name: str = "probe.fir"
                ) -> Path:
    """A copy of the sample in ``folder`` whose .fir adds the probe kernel (``body``: its
    instructions) and its node; returns the .fir's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        if not (folder / f).exists():
            shutil.copy(SAMPLE / f, folder / f)
    src = (SAMPLE / "gpt2.fir").read_text()
    kernel = (f"kernel t.s in=1 out=1 threads={threads} tg=1 tgbytes=16\n" + "\n".join(body)
              + "\nendkernel\n")
    src = src.replace("node token ext", kernel + "node token ext", 1)
    src = src.replace("node embeddings micro g2.add x pos_embed -> x\n",
                      "node embeddings micro g2.add x pos_embed -> x\n"
                      "node probe micro t.s x -> mix\n", 1)
    path = folder / name
    path.write_text(src)
    return path
