"""The persistent cache of compiled programs that ``jsample generate`` keeps beside the cached weights.

A second run loads its programs instead of compiling them; a damaged entry is rebuilt once instead of warned
about on every later run.
"""

import ast
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import jax

from jsample.models.weights import cache_root


def keep_compiled_programs() -> None:
  """Makes JAX keep compiled programs next to the cached weights, so a second run skips most of the compile time.

  The ``jsample`` command calls it; it changes JAX's global configuration, so library code does not.
  """
  jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# JAX turns an entry of the persistent cache it cannot read (truncated, corrupt) into this warning and compiles
# afresh, but never overwrites the entry: the same warning would come on every later run.
UNREADABLE = "Error reading persistent compilation cache entry"


@contextlib.contextmanager
def mending_compiled_programs() -> Iterator[None]:
  """Within it, a compiled program that JAX cannot read from the persistent cache is removed when JAX finds it, so
  that the program JAX compiles in its place is written there: rebuilt once, said once on stderr.

  JAX names the entry it reads only in a debug line of its cache (``Cache hit for key: '...'``), which this
  catches; where it does not, the entry stays and JAX's warning is shown as before.
  """
  folder = getattr(jax.config, "jax_compilation_cache_dir", None)
  if not folder:
    yield
    return
  keys: list[str] = []

  class Reads(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
      line = record.getMessage()
      if line.startswith("Cache hit for key: "):
        keys.append(ast.literal_eval(line.removeprefix("Cache hit for key: ")))

  def show(message, category, filename, lineno, file=None, line=None):
    entry = Path(folder) / f"{keys[-1]}-cache" if keys else None  # JAX's LRUCache names files key + "-cache"
    if UNREADABLE not in str(message) or entry is None or not entry.exists():
      return shown(message, category, filename, lineno, file, line)
    entry.unlink(missing_ok=True)
    print(f"jsample: removed a damaged compiled program ({entry}); compiling it afresh, once", file=sys.stderr)

  log, reads = logging.getLogger("jax._src.lru_cache"), Reads()
  level, propagate, shown = log.level, log.propagate, warnings.showwarning
  with warnings.catch_warnings():
    warnings.filterwarnings("always", message=UNREADABLE)  # seen each time, whatever the filters (pytest's)
    warnings.showwarning = show
    log.setLevel(logging.DEBUG)
    log.propagate = False  # its debug lines go to the handler alone
    log.addHandler(reads)
    try:
      yield
    finally:
      log.removeHandler(reads)
      log.setLevel(level)
      log.propagate = propagate
