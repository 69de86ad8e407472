"""The notebooks in ``notebooks/``: stored without outputs, and each one runs from start to end.

Running them (nbclient, a fresh IPython kernel per notebook, in ``notebooks/`` so they use this checkout) needs the
``gemma`` extra and Gemma's weights; the structured-output notebook also needs llguidance. All three come with the
README's test command. Each notebook takes under a minute on 2 cores once the weights are cached, most of it compiling.
"""

import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))


def require(module: str) -> None:
  """Imports ``module`` (a test-extra package); a missing one skips, and fails under CI (``$CI`` set)."""
  try:
    __import__(module)
  except ImportError as error:
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
      pytest.fail(f"CI is set and {module} is missing: {error}")
    pytest.skip(f"{module} is missing (install the test extra)")


def test_there_are_notebooks():
  assert {"sampling_explorer.ipynb", "batched_decoding.ipynb", "structured_output.ipynb", "speed.ipynb"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_stripped(name):
  """Outputs stay out of git: every code cell is stored unexecuted (Jupyter's "Clear All Outputs" before saving)."""
  require("nbformat")
  import nbformat

  notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
  nbformat.validate(notebook)
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, f"{name}: cell {index} has stored outputs"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name):
  require("nbclient")
  if name == "structured_output.ipynb":
    require("llguidance")
  import nbformat
  from nbclient import NotebookClient

  notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
  where = {"metadata": {"path": str(NOTEBOOKS)}}  # the kernel's working directory
  NotebookClient(notebook, timeout=300, kernel_name="python3", resources=where).execute()
  for index, cell in enumerate(notebook.cells):  # as filterwarnings = error does for the suite
    for output in cell.get("outputs", []):
      text = output.get("text", "") if output.get("name") == "stderr" else ""
      assert "Warning" not in text, f"{name}: cell {index} warned: {text}"
