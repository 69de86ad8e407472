"""The draw over what survives the chain, and the distribution it draws from."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jsample._src.kernels import noise
from jsample._src.kernels.rowmath import logsumexp
from jsample._src.logprobs import Logprobs


class Draw(NamedTuple):
  """What :meth:`Sampler.pick_with_info` returns besides the new state.

  Attributes:
    token: ``[B]`` int32, always in ``[0, V)``.
    valid: ``[B]`` bool; False when no token survived (every logit masked,
      ``-inf`` or NaN). ``token`` is then 0.
    logprob: ``[B]`` float32 log-probability of ``token`` under the final
      distribution the draw used (0 for greedy rows and invalid rows).
    raw: the token under the model's own distribution (:class:`Logprobs`:
      its log-probability, its rank, the best ``n``), where
      :meth:`Sampler.pick_with_info` was asked for it; else None.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.gemma(temperature=0.0)
    >>> draw, state = sampler.pick_with_info(jnp.array([[0.0, 2.0, 1.0]]), sampler.init(seed=[0]))
    >>> draw.token.tolist(), draw.valid.tolist(), draw.logprob.tolist()
    ([1], [True], [0.0])
  """

  token: jax.Array
  valid: jax.Array
  logprob: jax.Array
  raw: Logprobs | None = None


def relative(logits: jax.Array) -> jax.Array:
  """The logits minus the best one. Near the largest float, ``best + log Σ exp``
  rounds to ``best``: ties there (several +inf tokens) would each get mass 1."""
  best = jnp.max(logits)
  return logits - jnp.where(best > -jnp.inf, best, 0.0)


def softmax(logits: jax.Array) -> jax.Array:
  """Probabilities of the survivors; all zero when nothing survives."""
  e = jnp.where(logits > -jnp.inf, jnp.exp(relative(logits)), 0.0)
  return e / jnp.maximum(jnp.sum(e), 1.0)  # the best survivor alone adds 1


def on_candidates(logits: jax.Array, ids: jax.Array, step_bits: jax.Array) -> Draw:
  """The draw over one row's final candidates ``[K]``, with its log-probability."""
  logits = relative(logits)
  token, valid = noise.race(logits, ids, step_bits)
  chosen = jnp.max(jnp.where(ids == token, logits, -jnp.inf))
  return Draw(token, valid, jnp.where(valid, chosen - logsumexp(logits), 0.0))


def on_row(final: jax.Array, step_bits: jax.Array, race_row, *, logprob: bool) -> Draw:
  """The draw over one whole final row ``[V]``; its log-probability costs an exp per token."""
  final = relative(final)
  token, valid = race_row(final, step_bits)
  if not logprob:
    return Draw(token, valid, jnp.float32(0))
  # A masked maximum, not final[token]: on a row sharded over devices an index would gather the row.
  chosen = jnp.max(jnp.where(jnp.arange(final.shape[0]) == token, final, -jnp.inf))
  return Draw(token, valid, jnp.where(valid, chosen - logsumexp(final), 0.0))
