import gc
import os
from pathlib import Path

# Compiling is most of the suite's time, and the programs run on rows of a few hundred tokens: LLVM's
# optimisation of the CPU code they compile to costs more than it saves (llama_cpp()'s pick at 16 x 300:
# 6.3 s to compile, 4.2 s without it; same tokens: optimisation does not change IEEE float arithmetic).
# Set before JAX starts its backend (importing jsample does); an XLA_FLAGS of the caller's that names a
# level keeps it.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax
import pytest

from bench import reference
from jsample._src.kernels import strategy as strategies
from tests.helpers import EACH_STRATEGY

# equinox's strictness: a silent [B] x [B, V] broadcast or an implicit dtype
# promotion fails the suite instead of producing a wrong token.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


def compilation_cache() -> str | None:
  """Where the suite keeps compiled programs between runs: ``$JSAMPLE_TEST_CACHE`` if set (not ``0`` or empty),
  else nowhere; None too when JAX was given a cache directory of its own (``JAX_COMPILATION_CACHE_DIR``).

  Opt-in: a first run gains nothing from it (the same test files took 311 s with a fresh cache, 305 s without),
  and writing a fresh cache crashed XLA (a segfault in ``executable.serialize()``, test_gemma3 after 518
  tests, on CI and here alike). A rerun with a warm cache skips most of the compile time.
  """
  if jax.config.jax_compilation_cache_dir is not None:
    return None
  where = os.environ.get("JSAMPLE_TEST_CACHE", "")
  return None if where in ("", "0") else where


# Compilation dominates the suite's time, so a rerun loads every program it compiled
# before, however small (the jsample command does the same: keep_compiled_programs).
# JAX keys each entry by the program, the jax and XLA versions, the flags and the device.
if (CACHE := compilation_cache()) is not None:
  jax.config.update("jax_compilation_cache_dir", CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@pytest.fixture(scope="session")
def reference_file():
  """``reference_file(name)``: the path of a file of the recorded reference data in ``tests/data`` (or
  ``$JSAMPLE_REFERENCE``: bench/reference.py finds it). The data ships with the repository, so a missing file
  fails the test rather than skipping it."""

  def find(name: str) -> Path:
    path = reference.find(name)
    if path is None:
      pytest.fail(reference.missing(name))
    return path

  return find


@pytest.fixture(params=EACH_STRATEGY)
def every_strategy(request, monkeypatch):
  """Runs the test once per strategy (the accelerator strategy in the exhaustive tier): a sampler built
  with ``strategy="auto"`` (the default) resolves to each in turn. Use it with
  ``pytestmark = pytest.mark.usefixtures("every_strategy")``."""
  real = strategies.resolve
  monkeypatch.setattr(strategies, "resolve", lambda name: real(request.param if name == "auto" else name))
  return request.param


# The memory a worker may hold before it drops every compiled program (bytes of its resident set;
# ``$JSAMPLE_TEST_MEMORY``, in GiB, overrides it). Below it, programs JAX compiled for one file (the library's
# own jitted helpers, each eager operation at each shape) serve the next files too.
MEMORY_LIMIT = float(os.environ.get("JSAMPLE_TEST_MEMORY", "3")) * 2**30


def resident_bytes() -> int:
  """This process's resident set, from /proc (0 where there is none: then every file clears)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return 0


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs(request):
  """Frees each test file's own compiled programs (its ``functools.cache``d ones) when it ends, and every program
  JAX keeps once the worker's memory passes ``MEMORY_LIMIT``: JAX keeps every program it compiled for the life of
  the process, and over the whole suite they filled the machine's memory when nothing was freed."""
  yield
  for value in vars(request.module).values():
    if callable(getattr(value, "cache_clear", None)):
      value.cache_clear()
  gc.collect()
  if not 0 < resident_bytes() < MEMORY_LIMIT:
    jax.clear_caches()
    gc.collect()
