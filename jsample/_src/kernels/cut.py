"""The cut: the ``n`` best tokens of each row, exactly as ``lax.top_k``, in a few reads.

A full ``lax.top_k`` over 262144 entries costs some 15-20 reads of the row on
CPU. Two stages cost a few: take the maximum of every chunk of ``CHUNK``
tokens (one pass), keep the ``n`` chunks with the best maxima, and run
``top_k`` over their ``n * CHUNK`` entries only.

Exact, ties included: every chunk ranked above the chunk of a top-``n`` token
(by maximum, then chunk index) holds a distinct token ranked above that token,
so fewer than ``n`` chunks do. Gathering the chosen chunks in id order keeps
``top_k``'s ties going to the lower id.

The row is read raw, and cleaned (:func:`clean`) where it is read: a cleaned
float32 copy of a ``[B, V]`` batch would cost several reads to write.
"""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import masks
from jsample._src.kernels.rowmath import logsumexp

CHUNK = 32


def clean(raw: jax.Array, ids: jax.Array | None = None, mask: jax.Array | None = None) -> jax.Array:
  """The logits the chain sees, at token ``ids``: float32, NaN and disallowed as ``-inf``.

  ``+inf`` becomes the largest float (beside it every finite token has
  probability 0), and ``-0.0`` becomes ``0.0`` so that the two tie.

  Args:
    raw: logits as given, any float dtype, the same shape as ``ids``.
    ids: their token ids (needed with a mask only).
    mask: one row's mask, bool ``[V]`` or packed int32 ``[M]``, or None.
  """
  x = jnp.where(jnp.isnan(raw), -jnp.inf, raw.astype(jnp.float32))
  if mask is not None:
    assert ids is not None, "a mask needs the ids it is read at"
    x = jnp.where(masks.allowed_at(mask, ids), x, -jnp.inf)
  x = jnp.minimum(x, jnp.finfo(jnp.float32).max)
  return jnp.where(x == 0, 0.0, x)


def clean_row(raw: jax.Array, mask: jax.Array | None, *, branch_free: bool = False) -> jax.Array:
  """The whole cleaned row ``[V]``."""
  cleaned = lambda: clean(raw, jnp.arange(raw.shape[0], dtype=jnp.int32), mask)  # noqa: E731
  if branch_free or mask is not None or raw.dtype != jnp.float32:
    return cleaned()
  # A row without NaN or inf (its sum is finite) needs only -0 turned to +0:
  # one select instead of the fused cleaning.
  return lax.cond(jnp.isfinite(jnp.sum(raw)), lambda: jnp.where(raw == 0, 0.0, raw), cleaned)


def at(raw: jax.Array, ids: jax.Array, mask: jax.Array | None) -> jax.Array:
  """The cleaned logits of one row ``[V]`` at token ``ids [N]``; ids outside ``[0, V)`` read ``-inf``."""
  inside = (ids >= 0) & (ids < raw.shape[0])
  values = jnp.take(raw, ids, mode="clip")  # clamped: outside reads -inf below
  return jnp.where(inside, clean(values, ids, mask), -jnp.inf)


def top_candidates(
  raw: jax.Array, mask: jax.Array | None, n: int, *, branch_free: bool = False
) -> tuple[jax.Array, jax.Array]:
  """``lax.top_k`` of the cleaned rows ``[B, V]``: ``(logits [B, n], ids [B, n])``, ties to the lower id.

  With ``branch_free`` the cleaning is fused into the chunk maxima, with no
  ``lax.cond`` to skip it (what accelerators want).
  """
  batch, vocab = raw.shape
  if n * CHUNK >= vocab:
    return lax.top_k(jax.vmap(lambda r, m: clean_row(r, m, branch_free=branch_free))(raw, mask), n)
  chunks = -(-vocab // CHUNK)
  if chunks * CHUNK != vocab:
    raw = jnp.pad(raw, ((0, 0), (0, chunks * CHUNK - vocab)), constant_values=-jnp.inf)
  padded = raw.reshape(batch, chunks, CHUNK)
  spots = jnp.arange(chunks * CHUNK, dtype=jnp.int32).reshape(chunks, CHUNK)

  def cleaned_maxima():
    return jnp.max(jax.vmap(clean, in_axes=(0, None, 0))(padded, spots, mask), axis=-1)

  if branch_free:
    maxima = cleaned_maxima()
  elif mask is None and raw.dtype == jnp.float32:
    # On CPU, XLA vectorises a bare max or sum over a buffer, and not one fused
    # with the cleaning (about 10x slower). Cleaning is monotone, so it commutes
    # with max, except for NaN, which a vectorised max may silently skip past:
    # chunk sums (NaN stays NaN under addition) say when to take the slow way.
    # One variadic reduction gives both in a single pass over the row.
    bare, sums = lax.reduce(
      (padded, padded),
      (jnp.float32(-jnp.inf), jnp.float32(0)),
      lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]),
      (2,),
    )
    maxima = lax.cond(jnp.any(jnp.isnan(sums)), cleaned_maxima, lambda: clean(bare))
  elif mask is None:
    # Half-precision rows: a bare max is fast, a half-precision sum is not, but
    # a float32 sum of the row is (and NaN survives it just as well).
    dirty = jnp.any(jnp.isnan(jnp.sum(raw.astype(jnp.float32), axis=-1)))
    maxima = lax.cond(dirty, cleaned_maxima, lambda: clean(jnp.max(padded, axis=-1)))
  else:
    maxima = cleaned_maxima()
  _, best = lax.top_k(maxima, n)
  best = jnp.sort(best, axis=-1)  # id order, so that top_k's ties favour lower ids
  width = n * CHUNK  # not -1: a reshape cannot infer it when there are 0 rows
  # Indices from top_k are in bounds: promising so spares the accelerator's program the gathers' bounds checks
  # (about 90 HLO instructions). The CPU keeps them: without, its greedy workload (d) ran 2-4% slower.
  mode = "promise_in_bounds" if branch_free else None
  gathered = jnp.take_along_axis(padded, best[:, :, None], axis=1, mode=mode).reshape(batch, width)
  where_ids = (best[:, :, None] * CHUNK + jnp.arange(CHUNK, dtype=jnp.int32)[None, None, :]).reshape(batch, width)
  values = jax.vmap(clean)(gathered, where_ids, mask)
  logits, where = lax.top_k(values, n)
  # Without the barrier XLA fuses the selection into its consumers and redoes
  # it per use: five times slower on CPU.
  ids = jnp.take_along_axis(where_ids, where, axis=1, mode=mode)
  return lax.optimization_barrier((logits, ids))


def log_normalisers(raw: jax.Array, mask: jax.Array | None, top: jax.Array, *, branch_free: bool = False) -> jax.Array:
  """``log Σ exp`` of each cleaned row ``[B, V]``, given each row's cleaned maximum ``top [B]``.

  A bare exp-and-sum over the raw row is the cheap way (about 4 reads on CPU);
  cleaning fused into it costs several times more, so it runs, row by row,
  only when the cheap sum says a row holds NaN or +inf, or under a mask.
  ``branch_free`` fuses the cleaning for every row instead.
  """
  if branch_free:
    return jax.vmap(lambda r, m: logsumexp(clean_row(r, m, branch_free=True)))(raw, mask)
  if mask is None:
    shift = jnp.where(top > -jnp.inf, top, 0.0)
    sums = jnp.sum(jnp.exp(raw.astype(jnp.float32) - shift[:, None]), axis=-1)
    dirty = jnp.any(~jnp.isfinite(sums) | (top >= jnp.finfo(jnp.float32).max))
    return lax.cond(dirty, lambda: _cleaned_normalisers(raw, mask), lambda: shift + jnp.log(sums))
  return _cleaned_normalisers(raw, mask)


def _cleaned_normalisers(raw: jax.Array, mask: jax.Array | None) -> jax.Array:
  def one(i):  # indexed, not mapped over: mapping would copy the batch first
    return logsumexp(clean_row(raw[i], None if mask is None else mask[i]))

  if not raw.shape[0]:  # no rows: nothing to index
    return jnp.zeros((0,), jnp.float32)
  return lax.map(one, jnp.arange(raw.shape[0]))
