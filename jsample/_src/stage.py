"""What a stage is: settings it owns, and its action on candidates and on a row.

A stage acts twice over, once per path of :meth:`Sampler.pick`:

- ``on_candidates`` works on :class:`Candidates`, the ``K`` best tokens of the
  row after the one ``O(V)`` cut, like llama.cpp's token data array;
- ``on_row`` works on the full ``[V]`` row and must never sort it.

Both see one row at a time (the sampler ``vmap``s them) and must remove the
same tokens and leave the same logits, so that both paths draw the same token.
Removed tokens carry ``-inf``.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Setting(NamedTuple):
  """A per-row numeric setting that a stage reads from the sampler state.

  Attributes:
    name: the keyword users pass to ``init`` (``"top_p"``).
    default: the value rows get unless ``init`` says otherwise.
    dtype: ``jnp.float32`` or ``jnp.int32``.
    valid: predicate over values, False marks a bad one. It sees NumPy arrays in
      ``init``, and traced arrays in :meth:`Sampler.checked` mode, so write it
      with operators and ``jnp`` functions (``jnp.isfinite``, not ``np``).
    allowed: the allowed range in words, for the error message.
  """

  name: str
  default: float | int
  dtype: Any
  valid: Callable[[np.ndarray], np.ndarray]
  allowed: str


class Context(NamedTuple):
  """What a stage may read besides its settings, for one row.

  Attributes:
    window: ``[W]`` int32 ring buffer of recent token ids, ``-1`` for empty.
    position: ``[]`` int32 tokens accepted so far; the newest sits at
      ``window[(position - 1) % W]``.
    vocab: ``V``, the row's width (static).
  """

  window: jax.Array
  position: jax.Array
  vocab: int


class Candidates(NamedTuple):
  """The ``K`` best tokens of one row, in sampling order.

  Sampling order is logit descending, then id ascending. Stages that only
  remove tokens or apply a monotone map keep it; stages applied before the cut
  (penalties) may break it, and the sampler re-sorts after them.

  Attributes:
    ids: ``[K]`` int32 token ids.
    logits: ``[K]`` float32, ``-inf`` for removed tokens.
    total: ``[]`` log of the summed ``exp(logit)`` of every surviving token of
      the row, candidate or not; NaN when unknown (after a stage that changed
      tokens the candidates cannot see).
    complete: ``[]`` bool, True when no token outside the candidates survives.
    exact: ``[]`` bool, False when a stage could not decide from candidates;
      the row then takes the full-vocabulary path.
  """

  ids: jax.Array
  logits: jax.Array
  total: jax.Array
  complete: jax.Array
  exact: jax.Array

  def log_total(self) -> jax.Array:
    """``log Σ exp(logit)`` over all survivors: from the candidates when complete."""
    return jnp.where(self.complete, logsumexp(self.logits), self.total)

  def keep(self, keep: jax.Array) -> "Candidates":
    """Removes the candidates where ``keep`` is False."""
    return self._replace(logits=jnp.where(keep, self.logits, -jnp.inf))


class Stage(NamedTuple):
  """One step of a sampling chain; see the module docstring.

  Attributes:
    name: a short label (``"top_p"``), used by ``python -m jsample``.
    settings: the :class:`Setting` s this stage reads.
    on_candidates: ``(Candidates, settings, Context) -> Candidates``.
    on_row: ``(logits [V], settings, Context) -> logits [V]``.
    before_cut: True for stages that change logits of tokens in the window
      only, and run on ``K + W`` candidates before the cut to ``K`` (penalties).
  """

  name: str
  settings: tuple[Setting, ...]
  on_candidates: Callable[[Candidates, dict, Context], Candidates]
  on_row: Callable[[jax.Array, dict, Context], jax.Array]
  before_cut: bool = False


def logsumexp(logits: jax.Array) -> jax.Array:
  """``log Σ exp`` that returns ``-inf`` (not NaN) when every entry is ``-inf``."""
  top = jnp.max(logits)
  shift = jnp.where(top > -jnp.inf, top, 0.0)
  return shift + jnp.log(jnp.sum(jnp.exp(logits - shift)))


def survivor_rank(logits: jax.Array) -> jax.Array:
  """1-based rank of each candidate among the survivors, in sampling order."""
  return jnp.cumsum((logits > -jnp.inf).astype(jnp.int32))


def sort_candidates(ids: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Sorts ``(ids, logits)`` into sampling order: logit descending, id ascending."""
  neg, ids = jax.lax.sort((-logits, ids), num_keys=2)
  return ids, -neg
