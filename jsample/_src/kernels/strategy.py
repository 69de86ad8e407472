"""Strategies: how the same algorithm runs on a CPU and on an accelerator.

Both strategies compute the same tokens; they differ in how they skip work.

- ``"cpu"``: XLA's CPU backend runs conditionals and loops for free, and a pass
  over the row costs several reads when elementwise work is fused into it. So
  it skips: the full-vocabulary path runs row by row (``lax.map``), only for
  the rows that need it, the row statistics only when some row needs them,
  and the cut cleans the row only when a cheap sum says it holds NaN.
- ``"accelerator"``: on a GPU every ``lax.cond`` or loop predicate makes the
  host wait for the device, and a per-row loop becomes thousands of round
  trips, while a fused pass over ``[B, V]`` costs about one read. So it is
  batched and branch-free: one ``lax.cond`` per call, around the rare work
  (the full-vocabulary path), which then runs for the whole batch at once.

``"auto"`` picks the accelerator strategy on GPU and TPU backends at trace time.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import noise

NAMES = ("auto", "cpu", "accelerator")


class Strategy(NamedTuple):
  """What differs between backends, behind one seam.

  Attributes:
    name: ``"cpu"`` or ``"accelerator"``.
    branch_free: whether the cut and the statistics avoid ``lax.cond``.
    fallback: ``(path, slow, blank, *rows) -> (candidates, settled [B], full)``: each row's candidates from
      ``path`` (a :class:`~jsample._src.paths.CandidatePath`: its first run, or on the CPU each level of
      knowledge it needs, ``path.settle()``); ``settled`` where they decide the row; ``full`` holds
      ``slow(*row, edit)``, the full-vocabulary path (``edit``: the row's ``path.edit``, or None), where not
      settled, and ``blank`` (batched, the shape of ``slow``'s output) elsewhere. Pytrees batched over ``B``.
    race_row: ``(logits [V], step_bits [2]) -> (token, valid)`` over a whole row.
  """

  name: str
  branch_free: bool
  fallback: Callable[..., Any]
  race_row: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def select(ok: jax.Array, fast, slow):
  """Per row, ``fast`` where ``ok`` else ``slow``: pytrees batched over ``ok``'s axis."""

  def pick(a, b):
    return jnp.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, b)

  return jax.tree.map(pick, fast, slow)


def _step_by_step(path, slow, blank, *rows):
  """Each rarer step only where needed: the log-normalisers, then the statistics, when some row needs them
  (``path.settle()``), then the full path row by row (``lax.map``) for the rows that still do, so that its
  ``O(V)`` temporaries exist for one row at a time. (Rows are indexed inside the loop, not mapped over:
  mapping would copy the whole batch of logits first.)"""
  cands, ok = path.settle()
  if not ok.shape[0]:  # no rows: nothing to index
    return cands, ok, blank

  def one(i):
    empty = jax.tree.map(lambda a: a[i], blank)
    return lax.cond(ok[i], lambda: empty, lambda: slow(*jax.tree.map(lambda a: a[i], rows), None))

  # The loop carries the logits, which XLA copies in first: skip it when it has nothing to do.
  return cands, ok, lax.cond(jnp.all(ok), lambda: blank, lambda: lax.map(one, jnp.arange(ok.shape[0])))


def _all_at_once(path, slow, blank, *rows):
  """The full path for the whole batch at once, behind the call's one ``lax.cond``.

  The candidates are the first run's alone: once the full path runs for every row, refining them with the
  row's log-normaliser and statistics would only add their passes (and a copy of the chain to the program)
  to choose, for some rows, the same tokens.
  """
  first, ok = path.first()
  if not ok.shape[0]:
    return first, ok, blank
  return first, ok, lax.cond(jnp.all(ok), lambda: blank, lambda: jax.vmap(slow)(*rows, path.edit))


def _race_all(logits: jax.Array, step_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  return noise.race(logits, jnp.arange(logits.shape[0], dtype=jnp.int32), step_bits)


CPU = Strategy("cpu", False, _step_by_step, noise.race_row)
ACCELERATOR = Strategy("accelerator", True, _all_at_once, _race_all)


def resolve(name: str) -> Strategy:
  """The strategy called ``name``; ``"auto"`` looks at JAX's default backend (at trace time)."""
  if name == "auto":
    name = "cpu" if jax.default_backend() == "cpu" else "accelerator"
  return {"cpu": CPU, "accelerator": ACCELERATOR}[name]
