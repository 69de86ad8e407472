"""Top-n-σ: keep the tokens within ``n`` standard deviations of the best logit."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.stage import Candidates, Context, Setting, Settings, Stage


def _spread(logits: jax.Array) -> jax.Array:
  """The population standard deviation of the finite logits (0 when there are none)."""
  finite = logits > -jnp.inf
  count = jnp.maximum(jnp.sum(finite), 1).astype(jnp.float32)
  mean = jnp.sum(jnp.where(finite, logits, 0.0)) / count
  return jnp.sqrt(jnp.sum(jnp.where(finite, jnp.square(logits - mean), 0.0)) / count)


def top_n_sigma(n: float = -1.0) -> Stage:
  """Keeps tokens whose logit is at least ``max - n * σ``, σ the std of the row's logits.

  llama.cpp's arithmetic: σ is the population standard deviation of every
  finite logit of the row (not only the candidates), equality survives, and
  ``n <= 0`` turns the stage off. llama.cpp sums in float32 one token after
  another; jsample sums in float32 as a tree, which moves σ by about 5e-5
  relative on a Gemma row, so a logit that close to the threshold may fall on
  the other side.

  σ is a statistic of the whole row, so on candidates the stage reads it from
  the row statistics (:attr:`Stage.row_statistic`); after a stage that changed the
  row (active penalties) the row takes the full-vocabulary path.

  Args:
    n: ``top_n_sigma``; ``<= 0`` is off.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_n_sigma(1.0), jsample.temperature(1.0))
    >>> p = sampler.probs(jnp.array([3.0, 2.5, 0.0, -1.0]), sampler.init(seed=0))
    >>> [round(float(v), 3) for v in p]  # σ = 1.6, so the threshold is 1.4
    [0.622, 0.378, 0.0, 0.0]

  References:
    Tang et al., 2024, "Top-nσ: Not All Logits Are You Need".
  """
  setting = Setting(
    "top_n_sigma",
    n,
    jnp.float32,
    jnp.isfinite,
    "finite (<= 0: off)",
    -1.0,
    "keep tokens within n standard deviations of the best logit (<= 0: off)",
  )

  def row_statistic(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    return _spread(logits)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    n = s["top_n_sigma"]
    off = ~(n > 0)
    # All survivors are candidates when they cover the row; otherwise σ is the row's, known while the row is the cut's.
    sigma = jnp.where(c.covers_row, _spread(c.logits), ctx.row_statistic)
    usable = c.covers_row | (c.log_z_known & ~jnp.isnan(ctx.row_statistic))
    alive = c.logits > -jnp.inf
    kept = c.keep(c.logits >= jnp.max(c.logits) - n * sigma)
    # Tokens beyond the candidates rank below the last one: if it fell, so did they.
    covers = c.covers_row | (alive[-1] & (kept.logits[-1] == -jnp.inf))
    return c._replace(
      logits=jnp.where(off, c.logits, kept.logits),
      log_z_known=c.log_z_known & off,
      covers_row=jnp.where(off, c.covers_row, covers),
      decided=c.decided & (off | usable),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    n = s["top_n_sigma"]

    def cut():
      return jnp.where(logits >= jnp.max(logits) - n * _spread(logits), logits, -jnp.inf)

    return lax.cond(n > 0, cut, lambda: logits)

  return Stage(
    "top_n_sigma",
    (setting,),
    on_candidates,
    on_row,
    row_statistic=row_statistic,
    argmax_invariant=lambda s: jnp.bool_(True),
    is_neutral=lambda s: ~(s["top_n_sigma"] > 0),
  )
