"""Where the project's shared reference data lies (Gemma 3 270M rows and tokens recorded with
llama.cpp): one answer for the benchmark and the tests (``tests/conftest.py``).

The data is not in the repository; it sits in a ``shared/reference`` folder beside it, as CI
lays it out. ``JSAMPLE_REFERENCE=/path/to/reference`` names another folder.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository


def folders() -> list[Path]:
  """The folders searched, in order: ``$JSAMPLE_REFERENCE`` alone when it is set, else
  ``../shared/reference`` beside the repository, then ``shared/reference`` inside it."""
  if os.environ.get("JSAMPLE_REFERENCE"):
    return [Path(os.environ["JSAMPLE_REFERENCE"])]
  return [ROOT.parent / "shared" / "reference", ROOT / "shared" / "reference"]


def find(name: str) -> Path | None:
  """The first ``folder/name`` of :func:`folders` that is a file, or None."""
  return next((folder / name for folder in folders() if (folder / name).is_file()), None)


def missing(name: str) -> str:
  """Says that ``name`` is missing and where it was looked for."""
  where = " or ".join(str(folder) for folder in folders())
  return f"{name} not found in {where} (the project's shared reference data; JSAMPLE_REFERENCE=folder says where)"
