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
  batched and branch-free: one ``lax.cond`` per call, around the rare
  full-vocabulary path, which then runs for the whole batch at once; searches
  are unrolled; statistics are computed in the same pass as everything else.

``"auto"`` picks the accelerator strategy on GPU and TPU backends at trace time.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src import noise, search

NAMES = ("auto", "cpu", "accelerator")


class Strategy(NamedTuple):
  """What differs between backends, behind one seam.

  Attributes:
    name: ``"cpu"`` or ``"accelerator"``.
    branch_free: whether the cut and the statistics avoid ``lax.cond``.
    fallback: ``(ok [B], fast, slow, *rows) -> out``: per row, ``fast`` where
      ``ok``, else ``slow(*row)``; pytrees batched over ``B``.
    lazy: ``(ok [B], fast, compute) -> out``: per row, ``fast`` where ``ok``,
      else the rows of ``compute()``, a batched function of no arguments.
    search: the row kernel :func:`search.shortest_prefix` to use.
    race_row: ``(logits [V], bits [2]) -> (token, valid)`` over a whole row.
  """

  name: str
  branch_free: bool
  fallback: Callable[..., Any]
  lazy: Callable[..., Any]
  search: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
  race_row: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _select(ok: jax.Array, fast, slow):
  """Per row, ``fast`` where ``ok`` else ``slow``: pytrees batched over ``ok``'s axis."""

  def pick(a, b):
    return jnp.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, b)

  return jax.tree.map(pick, fast, slow)


def _rowwise(ok: jax.Array, fast, slow, *rows):
  """``slow`` row by row, only for the rows that need it: its ``O(V)``
  temporaries exist for one row at a time, and a batch where every row is
  ``ok`` pays nothing for it. (Rows are indexed inside the loop, not mapped
  over: mapping would copy the whole batch of logits first.)"""

  def one(i):
    pick = jax.tree.map(lambda a: a[i], fast)
    return lax.cond(ok[i], lambda: pick, lambda: slow(*jax.tree.map(lambda a: a[i], rows)))

  if not ok.shape[0]:  # no rows: nothing to index
    return fast
  # The loop carries the logits, which XLA copies in first: skip it when it has nothing to do.
  return lax.cond(jnp.all(ok), lambda: fast, lambda: lax.map(one, jnp.arange(ok.shape[0])))


def _skip_unless_needed(ok: jax.Array, fast, compute):
  return _select(ok, fast, lax.cond(jnp.all(ok), lambda: fast, compute))


def _batched(ok: jax.Array, fast, slow, *rows):
  """``slow`` for the whole batch at once, behind the call's one ``lax.cond``."""
  if not ok.shape[0]:
    return fast
  return lax.cond(jnp.all(ok), lambda: fast, lambda: _select(ok, fast, jax.vmap(slow)(*rows)))


def _always(ok: jax.Array, fast, compute):
  return _select(ok, fast, compute())


def _unrolled_search(logits: jax.Array, weight: jax.Array, target: jax.Array) -> jax.Array:
  return search.shortest_prefix(logits, weight, target, unroll=True)


def _race_all(logits: jax.Array, bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  return noise.race(logits, jnp.arange(logits.shape[0], dtype=jnp.int32), bits)


CPU = Strategy("cpu", False, _rowwise, _skip_unless_needed, search.shortest_prefix, noise.race_row)
ACCELERATOR = Strategy("accelerator", True, _batched, _always, _unrolled_search, _race_all)


def resolve(name: str) -> Strategy:
  """The strategy called ``name``; ``"auto"`` looks at JAX's default backend (at trace time)."""
  if name == "auto":
    name = "cpu" if jax.default_backend() == "cpu" else "accelerator"
  return {"cpu": CPU, "accelerator": ACCELERATOR}[name]
