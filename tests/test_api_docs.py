"""The Python API's documentation runs: the README's example, the example notebook through a
real Jupyter kernel (nbclient + ipykernel), and docs/api.md names every public call."""
from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

NOTEBOOKS = sorted((REPO / "docs" / "examples").glob("*.ipynb"))


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [b for b in blocks if "import firscope" in b and "firscope.open" in b]
    assert found, "the README has no ```python block that imports firscope and calls open"
    return found[0]


def test_the_readme_example_runs_in_a_fresh_process(tmp_path):
    done = subprocess.run([sys.executable, "-c", readme_example()], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("def ") and lines[0].endswith("(11, 256)")
    assert "Breakpoint 1, attention@1" in done.stdout


def test_there_is_an_example_notebook():
    assert NOTEBOOKS, "docs/examples/ holds no notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_carry_no_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_example_notebook_runs_in_a_real_kernel(path, tmp_path):
    """Every cell, in order, in an IPython kernel (as Jupyter runs it); any error fails."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    kinds = {k for o in outputs for k in o.get("data", {})}
    # the rich views were shown: HTML tables and heatmaps, and matplotlib figures
    assert {"text/html", "image/png"} <= kinds, kinds
    html = "".join(o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {}))
    for shown in ("firscope.Run", "<svg", "logit lens", "quantization error",
                  "activation patching"):
        assert shown in html, shown


def test_docs_name_every_public_call():
    import firscope
    from firscope.api.display import Attention, Lens, Weight
    from firscope.api.patching import PatchingResult
    text = (REPO / "docs" / "api.md").read_text()
    missing = []
    for cls in (firscope.Model, firscope.Run, firscope.Debugger, PatchingResult, Attention,
                Lens, Weight):
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") or name in ("s", "tok", "names", "model", "session"):
                continue
            if callable(member) or isinstance(member, property):
                if f"`{name}" not in text and f"{name}(" not in text and f"`{name}`" not in text:
                    missing.append(f"{cls.__name__}.{name}")
    for fn in ("open", "sweep", "logit_diff", "residual_targets"):
        assert fn in text
    assert not missing, f"docs/api.md does not name: {missing}"
