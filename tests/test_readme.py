"""Every ```python block of README.md runs as pasted, each in a fresh interpreter."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
  return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def test_every_fence_names_its_language():
  # A block meant as text says so (```text, ```bash): a bare fence would be neither run nor shown as code.
  assert all(lang for lang, _ in FENCE.findall(README.read_text()))


@pytest.mark.parametrize("code", blocks("python"), ids=lambda code: code.splitlines()[0][:40])
def test_python_block_runs(code, tmp_path):
  # A fresh process: a block may rely on nothing another one defined, and JAX starts with its own flags.
  root = str(README.parent)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
  # The mesh example must run on one device too: only the suite's own flag (tests/conftest.py) is kept.
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "optimization_level" in f)
  done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
  assert done.returncode == 0, f"README block starting {code.splitlines()[0]!r} failed:\n{done.stderr[-3000:]}"
