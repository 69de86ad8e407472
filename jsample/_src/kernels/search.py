"""Sort-free selection over a full row, for the full-vocabulary path.

The chain's truncations all keep a *prefix* of the row in its sampling order
(logit descending, then id ascending). Instead of sorting ``V`` entries, find
the prefix's last member by binary search: first over the float's order-
preserving bit pattern (32 passes), then among exact ties over the id (about
``log2 V`` passes). Every pass is one fused, memory-bound reduction.

The passes are loops of fixed length (``lax.fori_loop``), on every backend: XLA
knows their trip count, so on a GPU they run without asking the host between
passes, and written out they took the same time on an H200 (32 passes over
``[256, 262144]``: 2.15-2.29 ms either way) while making each program several
times larger and slower to compile.
"""

import jax
import jax.numpy as jnp
from jax import lax


def order_key(x: jax.Array) -> jax.Array:
  """Maps float32 to uint32 so that ``x < y`` exactly when ``key(x) < key(y)``."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def shortest_prefix(logits: jax.Array, weight: jax.Array, target: jax.Array) -> jax.Array:
  """The shortest prefix, in sampling order, whose weight reaches ``target``.

  Sampling order is logit descending, ties by id ascending; ``-inf`` entries
  carry zero weight. If the whole row's weight is below ``target`` (rounding),
  every finite entry is kept.

  Args:
    logits: ``[V]`` float32.
    weight: ``[V]`` non-negative weights (int32 counts or float32 masses).
    target: ``[]`` the weight the prefix must reach.

  Returns:
    ``[V]`` bool, True for members of the prefix.

  Examples:
    A stage's ``on_row`` keeps the smallest set of best tokens that holds 80% of the mass:

    >>> import jax, jax.numpy as jnp, jsample
    >>> logits = jnp.array([1.0, 3.0, 2.0, 3.0])
    >>> jsample.shortest_prefix(logits, jax.nn.softmax(logits), jnp.float32(0.8)).tolist()
    [False, True, True, True]
    >>> jsample.shortest_prefix(logits, jnp.ones(4, jnp.int32), jnp.int32(1)).tolist()  # ties: the lower id
    [False, True, False, False]
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
    trial = bound | (jnp.uint32(1) << jnp.asarray(31 - i).astype(jnp.uint32))
    return jnp.where(weight_from(trial) >= target, trial, bound)

  # The largest key whose upper set still reaches the target: the key of the
  # token that crosses it.
  crossing = lax.fori_loop(0, 32, refine_key, jnp.uint32(0))
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
  last = lax.fori_loop(0, id_bits, refine_id, jnp.int32(0))
  return (key > crossing) | (tied & (ids <= last))
