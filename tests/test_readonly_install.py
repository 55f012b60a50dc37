"""firscope installed where its user cannot write (a system-wide install, a read-only image).

numba's ``cache=True`` used to write beside the package's sources and ended in
"internal error: cannot cache function ...: no locator available". The package
is copied to a folder mounted read-only in a private mount namespace, with a
HOME and XDG cache folder that are read-only too, so firscope must fall back to
a private temporary folder.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and util-linux unshare to mount a read-only copy of the package")


def _can_mount_read_only(tmp: Path) -> bool:
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            f"mount --bind {tmp} {tmp} && mount -o remount,bind,ro {tmp} && "
                            f"! touch {tmp}/x 2>/dev/null"], capture_output=True)
    return probe.returncode == 0


def test_cli_runs_from_a_read_only_package(tmp_path):
    ro = tmp_path / "ro"
    pkg = ro / "firscope"
    shutil.copytree(REPO / "firscope", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "sample_models", pkg / "sample_models",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (ro / "home").mkdir()
    if not _can_mount_read_only(ro):
        pytest.skip("this sandbox cannot mount a read-only bind mount")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",)}
    env.update(HOME=str(ro / "home"), XDG_CACHE_HOME=str(ro / "home" / ".cache"),
               PYTHONPATH=str(ro), PYTHONDONTWRITEBYTECODE="1")
    script = (f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && "
              f"cd {tmp_path} && exec {sys.executable} -m firscope run --prompt 'def ' -n 3")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr
    assert r.stdout.startswith("def ")
    assert not any(p.name == "__pycache__" for p in pkg.rglob("*"))  # nothing written there
