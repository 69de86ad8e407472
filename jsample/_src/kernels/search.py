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

import functools

import jax
import jax.numpy as jnp
from jax import lax


def order_key(x: jax.Array) -> jax.Array:
  """Maps float32 to uint32 so that ``x < y`` exactly when ``key(x) < key(y)``."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def shortest_prefix(
  logits: jax.Array, weight: jax.Array, target: jax.Array, at_least=None, *, branch_free: bool = True
) -> jax.Array:
  """The shortest prefix, in sampling order, whose weight reaches ``target``, and that holds ``at_least`` finite
  entries if given.

  Sampling order is logit descending, ties by id ascending; ``-inf`` entries
  carry zero weight. If the whole row's weight is below ``target`` (rounding),
  or it holds fewer than ``at_least`` finite entries, every finite entry is kept.

  The two conditions in one search cost one set of passes (two sums in each),
  where two searches would cost two: the prefix that meets both is the longer
  of the two that meet one each (``min_keep`` beside top-p's mass). On an
  accelerator the two sums share each pass; on a CPU each is a pass of its
  own, so there (``branch_free=False``) the count is only searched where
  ``at_least > 1``, behind a ``lax.cond``.

  Args:
    logits: ``[V]`` float32.
    weight: ``[V]`` non-negative weights (int32 counts or float32 masses).
    target: ``[]`` the weight the prefix must reach.
    at_least: ``[]`` int32, or None: no count beyond the weight's.
    branch_free: with ``at_least``, search both conditions in every row (True), or only in the rows where
      ``at_least > 1`` (False: two searches in the program, one of them run).

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

    Top-p's nucleus, at least three tokens long (``min_keep``):

    >>> jsample.shortest_prefix(logits, jax.nn.softmax(logits), jnp.float32(0.5), jnp.int32(3)).tolist()
    [False, True, True, True]
  """
  if at_least is not None and not branch_free:
    both = lambda: shortest_prefix(logits, weight, target, at_least)  # noqa: E731
    return lax.cond(at_least > 1, both, lambda: shortest_prefix(logits, weight, target))
  (vocab,) = logits.shape
  key = order_key(logits)
  # Each condition as a weight and the target its sum must reach.
  weights, targets = [weight], [target]
  if at_least is not None:
    weights.append((logits > -jnp.inf).astype(jnp.int32))
    targets.append(jnp.asarray(at_least, jnp.int32))
  # A target of zero or less still keeps the first token: at least one survives.
  targets = [jnp.maximum(t, _smallest(w.dtype)) for w, t in zip(weights, targets, strict=True)]

  def weight_where(where) -> list[jax.Array]:
    return [jnp.sum(jnp.where(where, w, jnp.zeros((), w.dtype))) for w in weights]

  def reaches(where, needs) -> jax.Array:
    return functools.reduce(jnp.logical_and, [w >= t for w, t in zip(weight_where(where), needs, strict=True)])

  def refine_key(i, bound):
    trial = bound | (jnp.uint32(1) << jnp.asarray(31 - i).astype(jnp.uint32))
    return jnp.where(reaches(key >= trial, targets), trial, bound)

  # The largest key whose upper set still reaches the targets: the key of the
  # token that crosses the last of them.
  crossing = lax.fori_loop(0, 32, refine_key, jnp.uint32(0))
  tied = key == crossing
  ids = jnp.arange(vocab, dtype=jnp.int32)
  needs = [t - w for t, w in zip(targets, weight_where(key > crossing), strict=True)]

  def refine_id(i, last):
    # Largest `last` whose tied tokens below it fall short of some need.
    trial = last | (1 << (id_bits - 1 - i))
    short = ~reaches(tied & (ids < trial), needs)
    return jnp.where((trial <= vocab) & short, trial, last)

  id_bits = max(1, vocab.bit_length())
  last = lax.fori_loop(0, id_bits, refine_id, jnp.int32(0))
  return (key > crossing) | (tied & (ids <= last))


def _smallest(dtype) -> jax.Array:
  """The least positive weight of ``dtype``."""
  return jnp.asarray(1 if jnp.issubdtype(dtype, jnp.integer) else jnp.finfo(dtype).tiny, dtype)
