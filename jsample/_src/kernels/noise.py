"""The draw: an exponential race keyed by token id.

Sampling token ``i`` with probability ``softmax(l)_i`` is the same as taking
``argmax_i (l_i + g_i)`` with independent Gumbel noise ``g_i`` (Gumbel 1954;
the "Gumbel-max trick"). jsample draws every token's noise from a hash of the
row's step key and the token *id*, so the winner does not depend on how the
survivors are laid out: the K-candidate path and the full-vocabulary path
compute the same score for the same token and pick the same winner.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Multipliers of the "lowbias32" integer hash found by Chris Wellons' hash
# prospector: a full-avalanche 32-bit mix in five cheap operations.
_MUL_A = 0x7FEB352D
_MUL_B = 0x846CA68B
_GOLDEN = 0x9E3779B9
# Token-level hashes use salted step bits, so they never repeat a group's hash.
_TOKEN_SALT = np.array([0xA5A5A5A5, 0x3C3C3C3C], np.uint32)

GROUP = 32  # ids per noise group: 0..31, 32..63, ...
_GROUP_BITS = GROUP.bit_length() - 1


def _mix(x: jax.Array) -> jax.Array:
  x = x ^ (x >> 16)
  x = x * jnp.uint32(_MUL_A)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(_MUL_B)
  return x ^ (x >> 16)


def step_bits(key: jax.Array, position: jax.Array) -> jax.Array:
  """Two uint32 words that name one step of one row: ``fold_in(key, position)``.

  Args:
    key: a typed PRNG key ``[]``.
    position: the row's position ``[]``.

  Returns:
    ``[2]`` uint32.
  """
  step = jax.random.fold_in(key, position)
  return jax.random.bits(step, (2,), jnp.uint32)


def _bits(step_bits: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Two hashed uint32 words per id."""
  c = ids.astype(jnp.uint32)
  hi = _mix(_mix(c ^ step_bits[0]) + step_bits[1])
  lo = _mix(_mix(c + jnp.uint32(_GOLDEN)) ^ hi ^ step_bits[1])
  return hi, lo


def uniform(step_bits: jax.Array, ids: jax.Array) -> jax.Array:
  """A uniform in ``[0, 1)`` per token id, with 2^-56 resolution near zero.

  Args:
    step_bits: ``[2]`` uint32 from :func:`step_bits`.
    ids: token ids ``[N]`` int32.

  Returns:
    ``[N]`` float32 in ``[0, 1)``.
  """
  return unit_interval(*_bits(step_bits, ids))


def unit_interval(hi: jax.Array, lo: jax.Array) -> jax.Array:
  """Maps 56 random bits (``hi`` and the top 24 of ``lo``) to float32 in ``[0, 1)``.

  A single float32 uniform has 2^-24 resolution, which would make a survivor
  of probability 1e-9 unreachable. Here the high 24 bits land exactly on the
  float32 grid, and the next 32 refine every value to float32's relative
  precision, down to 2^-56. Rounding may carry the sum up to 1 at the very
  top (a 2^-25 chance); the clamp keeps it below.
  """
  coarse = (hi >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
  fine = (((hi & 0xFF) << 24) | (lo >> 8)).astype(jnp.float32) * jnp.float32(2.0**-56)
  return jnp.minimum(coarse + fine, jnp.float32(1 - 2.0**-24))


def gumbel(step_bits: jax.Array, ids: jax.Array) -> jax.Array:
  """Gumbel noise keyed by token id: ``[N]`` float32, independent across ids.

  The noise is built top-down per group of ``GROUP`` consecutive ids, so that
  a group's largest noise is known from one hash, without the group's other
  ids (which is what lets :func:`race_row` skip most of a row). The maximum of
  ``n`` standard Gumbels is ``Gumbel(log n)``, it sits at a uniformly chosen
  member (the group's leader), and the others are standard Gumbels below it:
  ``-log(exp(-max) + E)`` with ``E ~ Exp(1)``. Together these are exactly
  ``n`` independent standard Gumbels.

  Exponentials come from ``-log1p(-u)``, which keeps full relative precision
  for small ``u``, so the upper tail (what lets an unlikely token win) is
  honest down to probabilities near 2^-56.
  """
  # Ids are never negative: a shift and a mask are the floor division and the remainder, in fewer operations.
  top, leader = _group(step_bits, ids >> _GROUP_BITS)
  rest = -jnp.log(jnp.exp(-top) + _exponential(*_bits(step_bits ^ _TOKEN_SALT, ids)))
  return jnp.where((ids & (GROUP - 1)) == leader, top, rest)


def _exponential(hi: jax.Array, lo: jax.Array) -> jax.Array:
  return -jnp.log1p(-unit_interval(hi, lo))


def _group(step_bits: jax.Array, groups: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The largest noise of each group and the member (``0..GROUP-1``) that holds it."""
  hi, lo = _bits(step_bits, groups)
  top = jnp.float32(np.log(GROUP)) - jnp.log(_exponential(hi, lo))
  return top, (lo & (GROUP - 1)).astype(jnp.int32)  # lo's low bits are unused by the uniform


def race(logits: jax.Array, ids: jax.Array, step_bits: jax.Array):
  """Draws one survivor: ``argmax(logits + gumbel)``, ties to the lower id.

  Args:
    logits: ``[N]`` float32, ``-inf`` for removed tokens.
    ids: ``[N]`` int32 token ids of those logits.
    step_bits: ``[2]`` uint32 from :func:`step_bits`.

  Returns:
    ``(token, valid)``: the winning id (0 when nothing survives) and whether
    anything survived.
  """
  token, valid, _ = _race(logits, ids, step_bits)
  return token, valid


def _race(logits, ids, step_bits):
  alive = logits > -jnp.inf
  score = jnp.where(alive, logits + gumbel(step_bits, ids), -jnp.inf)
  best = jnp.max(score)
  id_sentinel = jnp.iinfo(jnp.int32).max
  token = jnp.min(jnp.where(alive & (score == best), ids, id_sentinel))
  valid = jnp.any(alive)
  return jnp.where(valid, token, 0), valid, best


def race_row(logits: jax.Array, step_bits: jax.Array, groups_read: int = 128):
  """:func:`race` over a whole row ``[V]`` (ids ``0..V-1``), hashing a few groups only.

  One hash per group gives the group's largest noise and the member that
  holds it (see :func:`gumbel`), so the leader's score is known exactly, and
  no member scores above the group's best logit plus that noise. Only groups
  whose bound reaches the best leader's score can hold the winner; the race
  runs over those. If there are more than ``groups_read`` of them (rare), it
  runs over every token.
  """
  (vocab,) = logits.shape
  groups = -(-vocab // GROUP)
  ids = jnp.arange(vocab, dtype=jnp.int32)
  if groups <= groups_read:
    return race(logits, ids, step_bits)
  padded = logits if groups * GROUP == vocab else jnp.pad(logits, (0, groups * GROUP - vocab), constant_values=-jnp.inf)
  padded = padded.reshape(groups, GROUP)
  top, leader = _group(step_bits, jnp.arange(groups, dtype=jnp.int32))
  floor = jnp.max(jnp.take_along_axis(padded, leader[:, None], axis=1, mode="promise_in_bounds")[:, 0] + top)
  contenders = jnp.max(padded, axis=1) + top >= floor
  (read,) = jnp.nonzero(contenders, size=groups_read, fill_value=0)  # repeats of group 0 change nothing
  read_ids = (read[:, None] * GROUP + jnp.arange(GROUP, dtype=jnp.int32)[None, :]).reshape(-1)
  token, valid = race(padded[read].reshape(-1), read_ids, step_bits)
  read_all_contenders = (jnp.sum(contenders) <= groups_read) & (floor > -jnp.inf)
  return lax.cond(read_all_contenders, lambda: (token, valid), lambda: race(logits, ids, step_bits))
