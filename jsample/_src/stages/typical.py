"""Locally typical sampling: keep the tokens whose surprise is closest to the row's entropy."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels.rowmath import entropy, logsumexp
from jsample._src.kernels.search import shortest_prefix
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage
from jsample._src.stages._min_keep import min_keep_setting


def typical(p: float = 1.0, min_keep: int = 0) -> Stage:
  """Locally typical sampling: keeps the most *typical* tokens until their mass exceeds ``p``.

  A token's surprise is ``-log p_i``; the row's entropy ``H`` is its expected
  surprise. Tokens are ranked by ``|-log p_i - H|`` (ties to the lower id),
  and the shortest prefix of that ranking whose probability is greater than
  ``p`` (strictly, as llama.cpp) survives, at least ``min_keep`` tokens long;
  if no prefix passes, every token survives. ``p >= 1`` is off.
  Probabilities are the softmax of the current survivors.

  Where it differs from llama.cpp: llama.cpp computes ``H`` as
  ``Σ -p_i logf(p_i)`` over every entry of its array, so a candidate of
  probability 0 (a ``-inf`` logit left by top-n-σ or a ban, or a logit about
  104 below the best) makes ``H`` NaN and the cut arbitrary: it may drop the
  most likely token. jsample takes ``H`` over the survivors (``0 log 0 = 0``)
  and works in the log domain, so a token far below the best has a tiny
  probability and a large score, never a NaN. Elsewhere the arithmetic is
  llama.cpp's, in float32, with sums as trees rather than sequential.

  The entropy is a statistic of the whole row: on candidates the stage reads
  it from the row statistics (:attr:`Stage.row_statistic`) unless the candidates
  cover the row (after top-k, say), and the row decides there only when the
  kept tokens all rank before any token beyond the candidates could.

  Args:
    p: ``typical_p``, in ``[0, 1]``; ``1`` is off.
    min_keep: ``min_keep``, keep at least this many tokens (0 and 1 alike);
      shared with the other stages that take it.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.typical(0.25), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> p = sampler.probs(logits, sampler.init(seed=0))
    >>> [round(float(v), 3) for v in p]  # H = 1.14 nats; token 1's surprise (1.20) is closest
    [0.0, 1.0, 0.0, 0.0]
    >>> p = sampler.probs(logits, sampler.init(seed=0, min_keep=2))
    >>> [round(float(v), 3) for v in p]  # then token 0 (0.69), the next closest
    [0.625, 0.375, 0.0, 0.0]

  References:
    Meister et al., 2023, "Locally Typical Sampling".
  """
  setting = Setting(
    "typical_p",
    p,
    jnp.float32,
    lambda v: (v >= 0) & (v <= 1),
    "in [0, 1] (1: off)",
    1.0,
    "keep the tokens closest to the row's entropy until their probabilities add up to more than p",
  )

  def row_statistic(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    return lax.cond(s["typical_p"] < 1, lambda: entropy(logits, logsumexp(logits)), lambda: jnp.float32(0))

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    p, least = s["typical_p"], s["min_keep"]
    off = ~(p < 1)
    alive = c.logits > -jnp.inf
    log_z, _ = c.log_normaliser()
    # All survivors are candidates when they cover the row; otherwise H is the row's, known while the row is the cut's.
    h = jnp.where(c.covers_row, entropy(c.logits, log_z), ctx.row_statistic)
    usable = c.covers_row | (c.log_z_known & ~jnp.isnan(ctx.row_statistic))
    centre = log_z - h  # the logit whose surprise is H
    score = jnp.where(alive, jnp.abs(c.logits - centre), jnp.inf)
    probs = jnp.where(alive, jnp.exp(c.logits - log_z), 0.0)
    ranked, ids, mass = lax.sort((score, c.ids, probs), num_keys=2)
    index = jnp.arange(c.ids.shape[0])
    reached = (jnp.cumsum(mass) > p) & (index >= least - 1) & (ranked < jnp.inf)
    found = jnp.any(reached)
    last = jnp.argmax(reached)
    keep = (score < ranked[last]) | ((score == ranked[last]) & (c.ids <= ids[last])) | ~found
    # Tokens beyond the candidates have logits <= the last one's, so scores >= floor:
    # a cut made strictly below the floor leaves them all out.
    floor = jnp.maximum(centre - c.logits[-1], 0.0)
    covers = c.covers_row | (usable & alive[-1] & found & (ranked[last] < floor))
    return c.keep(keep | off)._replace(
      log_z_known=c.log_z_known & off,
      covers_row=jnp.where(off, c.covers_row, covers),
      decided=c.decided & (off | covers),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    p, least = s["typical_p"], s["min_keep"]

    def cut():
      alive = logits > -jnp.inf
      log_z = logsumexp(logits)
      centre = log_z - entropy(logits, log_z)
      # The search keeps a prefix in descending key order, ties to the lower id: -score ranks the most typical first.
      key = jnp.where(alive, -jnp.abs(logits - centre), -jnp.inf)
      # Mass strictly above p: a float sum exceeds p exactly when it reaches the next float.
      above = jnp.nextafter(p, jnp.float32(2))
      keep = shortest_prefix(key, jnp.exp(logits - log_z), above, least, branch_free=ctx.branch_free)
      return jnp.where(keep & alive, logits, -jnp.inf)

    return lax.cond(p < 1, cut, lambda: logits)

  return Stage(
    "typical",
    (setting, min_keep_setting(min_keep)),
    on_candidates,
    on_row,
    argmax_invariant=lambda s: ~(s["typical_p"] < 1),  # on, it may drop the most likely token
    row_statistic=row_statistic,
    is_neutral=lambda s: ~(s["typical_p"] < 1),
  )
