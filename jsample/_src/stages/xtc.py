"""XTC, "exclude top choices": with some probability, remove every likely token but the least likely of them."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels.rowmath import logsumexp
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, survivor_rank
from jsample._src.stages._min_keep import min_keep_setting

_SALT = 0x787463  # "xtc": the coin's place in the row's stream, apart from the draw's noise


def xtc(probability: float = 0.0, threshold: float = 0.1, min_keep: int = 0) -> Stage:
  """XTC: with chance ``probability``, removes the tokens of probability ``>= threshold`` but the last of them.

  llama.cpp's arithmetic: a coin from the row's own stream decides whether the
  stage acts at this step; if it does, probabilities are the softmax of the
  current survivors, and every token with ``p >= threshold`` except the least
  likely one (the last in sampling order: among ties, the highest id) is
  removed, unless fewer than ``min_keep`` tokens would remain, in which case
  nothing is. With fewer than two such tokens nothing changes. It is off where
  ``probability <= 0`` or ``threshold > 0.5`` (no token but one can reach it).

  The coin is :meth:`Context.uniform` of the row's step bits, so it depends on
  the row's seed and position only, never on its batch slot, the batch size or
  the path taken. It differs from llama.cpp's in its stream: llama.cpp draws one
  float from an ``mt19937`` of its own (seeded like the final draw's), so the
  chance it acts is ``probability`` up to about ``2^-25``, and the same seed
  does not give llama.cpp's coin.

  Args:
    probability: ``xtc_probability``, in ``[0, 1]``; ``0`` is off.
    threshold: ``xtc_threshold``, in ``[0, 1]``; above ``0.5`` is off.
    min_keep: ``min_keep``: act only if at least this many tokens remain;
      shared with the other stages that take it.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.xtc(probability=1.0, threshold=0.1), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> p = sampler.probs(logits, sampler.init(seed=0))
    >>> [round(float(v), 3) for v in p]  # 0.5, 0.3 and 0.15 reach 0.1: the first two go
    [0.0, 0.0, 0.75, 0.25]
    >>> p = sampler.probs(logits, sampler.init(seed=0, min_keep=3))
    >>> [round(float(v), 3) for v in p]  # only two would remain: nothing goes
    [0.5, 0.3, 0.15, 0.05]

  References:
    p-e-w, 2024, "Exclude Top Choices (XTC): a sampler that boosts creativity,
    breaks writing clichés, and inhibits non-verbatim repetition",
    https://github.com/oobabooga/text-generation-webui/pull/6335.
  """
  settings = (
    Setting(
      "xtc_probability",
      probability,
      jnp.float32,
      lambda v: (v >= 0) & (v <= 1),
      "in [0, 1] (0: off)",
      0.0,
      "the chance that XTC acts at a step",
    ),
    Setting(
      "xtc_threshold",
      threshold,
      jnp.float32,
      lambda v: (v >= 0) & (v <= 1),
      "in [0, 1] (> 0.5: off)",
      1.0,
      "XTC removes the tokens at least this likely, but the least likely of them",
    ),
    min_keep_setting(min_keep),
  )

  def acts(s: Settings, ctx: Context) -> jax.Array:
    """Whether the stage acts on this row at this step: on, and the coin says so."""
    chance = s["xtc_probability"]
    return (chance > 0) & ~(s["xtc_threshold"] > 0.5) & (ctx.uniform(_SALT) <= chance)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    t, least = s["xtc_threshold"], s["min_keep"]
    alive = c.logits > -jnp.inf
    log_z, known = c.log_normaliser()
    above = alive & (jnp.exp(c.logits - log_z) >= t)  # a prefix of the survivors, in sampling order
    gone = jnp.sum(above) - 1
    count = jnp.sum(alive)
    # Tokens beyond the candidates reach the threshold only if the last candidate does.
    counted = c.covers_row | (alive[-1] & ~above[-1])
    # Beyond the candidates there are more survivors, never fewer: enough here is enough.
    enough = count - gone >= least
    act = acts(s, ctx)
    remove = act & (gone > 0) & enough
    return c._replace(
      logits=jnp.where(remove & above & (survivor_rank(c.logits) <= gone), -jnp.inf, c.logits),
      log_z_known=c.log_z_known & ~remove,
      decided=c.decided & (~act | (known & counted & (c.covers_row | enough | (gone <= 0)))),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    t, least = s["xtc_threshold"], s["min_keep"]

    def cut():
      alive = logits > -jnp.inf
      above = alive & (jnp.exp(logits - logsumexp(logits)) >= t)
      gone = jnp.sum(above) - 1
      # The last above-threshold token in sampling order: the lowest logit among them, then the highest id.
      lowest = jnp.min(jnp.where(above, logits, jnp.inf))
      ids = jnp.arange(logits.shape[0], dtype=jnp.int32)
      last = jnp.max(jnp.where(above & (logits == lowest), ids, -1))
      remove = (gone > 0) & (jnp.sum(alive) - gone >= least)
      return jnp.where(remove & above & (ids != last), -jnp.inf, logits)

    return lax.cond(acts(s, ctx), cut, lambda: logits)

  def argmax_invariant(s: Settings) -> jax.Array:
    return ~(s["xtc_probability"] > 0) | (s["xtc_threshold"] > 0.5)  # on, it removes the best when its coin says so

  return Stage("xtc", settings, on_candidates, on_row, argmax_invariant=argmax_invariant, is_neutral=argmax_invariant)
