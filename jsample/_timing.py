"""Wall-clock timing of jitted calls, shared by ``jsample demo``, ``jsample generate`` and ``python -m bench``.

JAX dispatches asynchronously, so each call is timed up to ``jax.block_until_ready`` on its result; the first
call is a warm-up (it may compile) and is not counted; the median of the rest resists a stray slow call on a
shared machine.

Example::

  import jax, jax.numpy as jnp
  from jsample._timing import seconds

  x = jnp.ones((64, 262144))
  floor = seconds(jax.jit(lambda x: jnp.max(x, axis=-1)), x)  # median seconds per call
"""

import statistics
import time

import jax


def seconds(fn, *args, repeats: int = 20) -> float:
  """Median wall time of ``fn(*args)`` after one warm-up call.

  Args:
    fn: a jitted function or a compiled program (``jax.jit(f).lower(...).compile()``).
    *args: its arguments, already on the device.
    repeats: the timed calls.

  Returns:
    The median seconds per call, each waited for with ``jax.block_until_ready``.
  """
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
