"""Log-probabilities under the model's own distribution: the drawn token's, its rank, the best ``n``.

What an OpenAI or vLLM response reports beside the token (``logprobs``,
``top_logprobs``), and what RL reads as the behaviour policy's raw
distribution: the softmax of the logits as given, NaN counted as ``-inf``, no
mask and no stage. (The log-probability under the distribution the draw used
is :attr:`Draw.logprob`.) Everything is reduced on the device: a few passes
over the row, and ``[B, n]`` leaves it, never ``[B, V]``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jsample._src.kernels import cut
from jsample._src.kernels.strategy import Strategy


class Logprobs(NamedTuple):
  """The drawn tokens under the raw model distribution; batched over ``B``.

  Attributes:
    logprob: ``[B]`` float32 log-probability of the drawn token (``-inf``
      where the model gave it none, NaN where no token was drawn).
    rank: ``[B]`` int32, 1 for the model's most likely token (ties to the
      lower id, as everywhere); 0 where no token was drawn.
    top_ids: ``[B, n]`` int32 the ``n`` most likely tokens, best first; ``-1``
      beyond a row's own ``n``.
    top_logprobs: ``[B, n]`` float32 their log-probabilities; ``-inf`` beyond a
      row's own ``n``.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.gemma(temperature=0.0)
    >>> logits = jnp.log(jnp.array([[0.2, 0.5, 0.3]]))
    >>> draw, _ = sampler.pick_with_info(logits, sampler.init(seed=[0]), top_logprobs=2)
    >>> draw.raw.rank.tolist(), draw.raw.top_ids.tolist()
    ([1], [[1, 2]])
    >>> [round(float(p), 3) for p in jnp.exp(draw.raw.top_logprobs[0])]
    [0.5, 0.3]
  """

  logprob: jax.Array
  rank: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array


def of(raw: jax.Array, token: jax.Array, valid: jax.Array, n: int, per_row, strategy: Strategy) -> Logprobs:
  """:class:`Logprobs` of the drawn ``token [B]`` in the raw rows ``[B, V]``, with ``n`` alternatives.

  Args:
    raw: the logits as given, any float dtype.
    token: ``[B]`` the drawn tokens; ``valid [B]`` where one was drawn.
    n: the static number of alternatives.
    per_row: optional ``[B]`` ints ``<= n``, each row's own number.
    strategy: the call's strategy (how the cut and the normaliser read the row).
  """
  vocab = raw.shape[-1]
  best, ids = cut.top_candidates(raw, None, min(max(n, 1), vocab), branch_free=strategy.branch_free)
  log_z = cut.log_normalisers(raw, None, best[:, 0], branch_free=strategy.branch_free)
  chosen = jax.vmap(lambda r, t: cut.at(r, t[None], None)[0])(raw, token)

  def rank(row, value, tok):
    x = cut.clean(row)
    ahead = (x > value) | ((x == value) & (jnp.arange(vocab) < tok))
    return 1 + jnp.sum(ahead, dtype=jnp.int32)

  width = min(n, vocab)
  shown = jnp.arange(width)[None, :] < (width if per_row is None else jnp.asarray(per_row)[:, None])
  return Logprobs(
    logprob=jnp.where(valid, chosen - log_z, jnp.nan),
    rank=jnp.where(valid, jax.vmap(rank)(raw, chosen, token), 0),
    top_ids=jnp.where(shown, ids[:, :width], -1),
    top_logprobs=jnp.where(shown, best[:, :width] - log_z[:, None], -jnp.inf),
  )
