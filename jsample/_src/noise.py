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

# Multipliers of the "lowbias32" integer hash found by Chris Wellons' hash
# prospector: a full-avalanche 32-bit mix in five cheap operations.
_MUL_A = 0x7FEB352D
_MUL_B = 0x846CA68B
_GOLDEN = 0x9E3779B9


def _mix(x: jax.Array) -> jax.Array:
  x = x ^ (x >> 16)
  x = x * jnp.uint32(_MUL_A)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(_MUL_B)
  return x ^ (x >> 16)


def step_words(key: jax.Array, position: jax.Array) -> jax.Array:
  """Two uint32 words that name one step of one row: ``fold_in(key, position)``.

  Args:
    key: a typed PRNG key ``[]``.
    position: the row's position ``[]``.

  Returns:
    ``[2]`` uint32.
  """
  step = jax.random.fold_in(key, position)
  return jax.random.bits(step, (2,), jnp.uint32)


def uniform(words: jax.Array, ids: jax.Array) -> jax.Array:
  """A uniform in ``[0, 1)`` per token id, with 2^-56 resolution near zero.

  Args:
    words: ``[2]`` uint32 from :func:`step_words`.
    ids: token ids ``[N]`` int32.

  Returns:
    ``[N]`` float32 in ``[0, 1)``.
  """
  c = ids.astype(jnp.uint32)
  hi = _mix(_mix(c ^ words[0]) + words[1])
  lo = _mix(_mix(c + jnp.uint32(_GOLDEN)) ^ hi ^ words[1])
  return unit_interval(hi, lo)


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


def gumbel(words: jax.Array, ids: jax.Array) -> jax.Array:
  """Gumbel noise ``-log(E)`` with ``E ~ Exp(1)``, keyed by token id.

  ``E = -log1p(-u)`` keeps full relative precision for small ``u``, so the
  upper tail of the noise (what lets an unlikely token win) is honest down to
  probabilities near 2^-56.
  """
  exponential = -jnp.log1p(-uniform(words, ids))
  return -jnp.log(exponential)


def race(logits: jax.Array, ids: jax.Array, words: jax.Array):
  """Draws one survivor: ``argmax(logits + gumbel)``, ties to the lower id.

  Args:
    logits: ``[N]`` float32, ``-inf`` for removed tokens.
    ids: ``[N]`` int32 token ids of those logits.
    words: ``[2]`` uint32 step words.

  Returns:
    ``(token, valid)``: the winning id (0 when nothing survives) and whether
    anything survived.
  """
  alive = logits > -jnp.inf
  score = jnp.where(alive, logits + gumbel(words, ids), -jnp.inf)
  best = jnp.max(score)
  id_sentinel = jnp.iinfo(jnp.int32).max
  token = jnp.min(jnp.where(alive & (score == best), ids, id_sentinel))
  valid = jnp.any(alive)
  return jnp.where(valid, token, 0), valid
