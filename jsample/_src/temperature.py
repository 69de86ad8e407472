"""Temperature, and greedy decoding at temperature zero."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, logsumexp


def _scale(logits: jax.Array, best: jax.Array, t: jax.Array) -> jax.Array:
  # Shifting by the best logit first keeps (logit - best) / t finite for tiny t.
  shifted = jnp.where(best > -jnp.inf, logits - best, logits)
  # Removed tokens stay -inf: a traced t = +inf would make them -inf / inf = NaN.
  return jnp.where(logits > -jnp.inf, shifted / jnp.where(t > 0, t, 1.0), -jnp.inf)


def temperature(t: float = 0.8) -> Stage:
  """Divides the surviving logits by ``t``; ``t <= 0`` is greedy.

  Greedy keeps only the best survivor, ties to the lower id: with the
  llama.cpp order, that is the highest logit after mask and penalties.
  The logits are shifted by their maximum first, which changes no probability
  and keeps tiny temperatures finite. Its row statistic is the log-normaliser
  of the tempered row, so that a truncation after it (transformers' order)
  decides on candidates when its nucleus lies within them.

  Args:
    t: ``temperature``, any finite number; ``<= 0`` means greedy.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.temperature(0.0))
    >>> token, _ = sampler.pick(jnp.array([1.0, 3.0, 3.0, 2.0]), sampler.init(seed=0))
    >>> int(token)
    1
  """
  setting = Setting(
    "temperature",
    t,
    jnp.float32,
    jnp.isfinite,
    "finite (<= 0: greedy)",
    1.0,
    "divide the logits by it: below 1 sharpens, above 1 flattens (<= 0: greedy)",
  )

  def row_stat(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    t = s["temperature"]
    # Only 0 < t != 1 needs it (t == 1 shifts a known normaliser; greedy completes): skip the pass otherwise.
    return lax.cond((t > 0) & (t != 1), lambda: logsumexp(_scale(logits, jnp.max(logits), t)), lambda: jnp.float32(0))

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    t = s["temperature"]
    best = jnp.max(c.logits)
    alive = c.logits > -jnp.inf
    first = jnp.argmax(alive)  # sampling order: the first survivor is the best
    greedy = jnp.where(jnp.arange(c.ids.shape[0]) == first, c.logits, -jnp.inf)
    # t == 1 only shifts the row, so a known log-normaliser shifts with it; any
    # other t takes the row statistic, which describes the row as the cut gave
    # it: that is this row where the log-normaliser is known. Greedy completes.
    stat = jnp.float32(jnp.nan) if ctx.stat is None else ctx.stat
    return c._replace(
      logits=jnp.where(t > 0, _scale(c.logits, best, t), _scale(greedy, best, t)),
      log_z=jnp.where(t == 1, c.log_z - jnp.where(best > -jnp.inf, best, 0.0), stat),
      log_z_known=c.log_z_known & ((t == 1) | (ctx.stat is not None)),
      complete=c.complete | (t <= 0),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    t = s["temperature"]
    best = jnp.max(logits)

    def greedy():
      first = jnp.argmax(logits)  # ties to the lower id
      return _scale(jnp.where(jnp.arange(logits.shape[0]) == first, logits, -jnp.inf), best, t)

    return lax.cond(t > 0, lambda: _scale(logits, best, t), greedy)

  return Stage("temperature", (setting,), on_candidates, on_row, row_stat=row_stat)
