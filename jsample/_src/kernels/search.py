"""Sort-free selection over a full row, for the full-vocabulary path.

The chain's truncations all keep a *prefix* of the row in its sampling order
(logit descending, then id ascending). Instead of sorting ``V`` entries, find
the prefix's last member by binary search: first over the float's order-
preserving bit pattern (32 passes), then among exact ties over the id (about
``log2 V`` passes). Every pass is one fused, memory-bound reduction.
"""

import jax
import jax.numpy as jnp
from jax import lax


def order_key(x: jax.Array) -> jax.Array:
  """Maps float32 to uint32 so that ``x < y`` exactly when ``key(x) < key(y)``."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def shortest_prefix(logits: jax.Array, weight: jax.Array, target: jax.Array, *, unroll: bool = False) -> jax.Array:
  """The shortest prefix, in sampling order, whose weight reaches ``target``.

  Sampling order is logit descending, ties by id ascending; ``-inf`` entries
  carry zero weight. If the whole row's weight is below ``target`` (rounding),
  every finite entry is kept.

  Args:
    logits: ``[V]`` float32.
    weight: ``[V]`` non-negative weights (int32 counts or float32 masses).
    target: ``[]`` the weight the prefix must reach.
    unroll: run the fixed passes as straight-line code instead of a loop
      (what accelerators want: a loop's predicate makes the host wait).

  Returns:
    ``[V]`` bool, True for members of the prefix.
  """
  (vocab,) = logits.shape
  key = order_key(logits)
  zero = jnp.zeros((), weight.dtype)
  # A target of zero or less still keeps the first token: at least one survives.
  smallest = 1 if jnp.issubdtype(weight.dtype, jnp.integer) else jnp.finfo(weight.dtype).tiny
  target = jnp.maximum(target, jnp.asarray(smallest, weight.dtype))

  def weight_from(bound):
    return jnp.sum(jnp.where(key >= bound, weight, zero))

  def refine_key(i, bound):
    trial = bound | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    return jnp.where(weight_from(trial) >= target, trial, bound)

  # The largest key whose upper set still reaches the target: the key of the
  # token that crosses it.
  crossing = _repeat(32, refine_key, jnp.uint32(0), unroll)
  above = jnp.sum(jnp.where(key > crossing, weight, zero))
  tied = key == crossing
  ids = jnp.arange(vocab, dtype=jnp.int32)
  need = target - above

  def refine_id(i, last):
    # Largest `last` whose tied tokens below it weigh less than `need`.
    trial = last | (1 << (id_bits - 1 - i))
    short = jnp.sum(jnp.where(tied & (ids < trial), weight, zero)) < need
    return jnp.where((trial <= vocab) & short, trial, last)

  id_bits = max(1, vocab.bit_length())
  last = _repeat(id_bits, refine_id, jnp.int32(0), unroll)
  return (key > crossing) | (tied & (ids <= last))


def _repeat(count: int, body, value, unroll: bool):
  """``lax.fori_loop(0, count, body, value)``, or the same passes written out."""
  if not unroll:
    return lax.fori_loop(0, count, body, value)
  for i in range(count):
    value = body(jnp.int32(i), value)
  return value
