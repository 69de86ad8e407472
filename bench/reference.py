"""Where the recorded Gemma 3 270M data lies, for the benchmark and the tests: ``tests/data`` in the repository
(eight real rows and llama.cpp's tokens, described in ``tests/data/README.md``), or the folder
``$JSAMPLE_REFERENCE`` names (a larger recording with the same file names, say).
"""

import os
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def folder() -> Path:
  """``$JSAMPLE_REFERENCE`` when it is set, else the repository's ``tests/data``."""
  return Path(os.environ.get("JSAMPLE_REFERENCE") or DATA)


def find(name: str) -> Path | None:
  """``folder() / name`` if it is a file, else None."""
  path = folder() / name
  return path if path.is_file() else None


def missing(name: str) -> str:
  """Says that ``name`` is missing and where it was looked for."""
  return f"{name} not found in {folder()} (JSAMPLE_REFERENCE=folder says where else to look)"
