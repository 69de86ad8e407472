"""Truncation: top-k, top-p (nucleus) and min-p.

Each keeps a prefix of the row in sampling order (logit descending, ties to
the lower id) and always keeps at least one survivor.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src.search import shortest_prefix
from jsample._src.stage import Candidates, Context, Setting, Stage, logsumexp, survivor_rank


def top_k(k: int = 40) -> Stage:
  """Keeps exactly the ``k`` best tokens; ``k <= 0`` keeps all.

  Ties at the boundary go to the lower token id.

  Args:
    k: ``top_k``, the default for every row; any integer.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(1))
    >>> token, _ = sampler.pick(jnp.array([0.0, 2.0, 2.0]), sampler.init(seed=0))
    >>> int(token)  # a tie: the lower id survives
    1

  References:
    Fan et al., 2018, "Hierarchical Neural Story Generation".
  """
  setting = Setting("top_k", k, jnp.int32, lambda v: np.ones(np.shape(v), bool), "any integer (<= 0: off)")

  def limit(s: dict, ctx: Context) -> jax.Array:
    k = s["top_k"]
    return jnp.where((k <= 0) | (k >= ctx.vocab), ctx.vocab, k)

  def on_candidates(c: Candidates, s: dict, ctx: Context) -> Candidates:
    k = limit(s, ctx)
    (budget,) = c.ids.shape
    fits = k <= budget
    cut = c.keep(survivor_rank(c.logits) <= k)
    return cut._replace(
      complete=c.complete | fits,
      exact=c.exact & (fits | c.complete | (k >= ctx.vocab)),
    )

  def on_row(logits: jax.Array, s: dict, ctx: Context) -> jax.Array:
    k = limit(s, ctx)

    def cut():
      keep = shortest_prefix(logits, (logits > -jnp.inf).astype(jnp.int32), k)
      return jnp.where(keep, logits, -jnp.inf)

    return lax.cond(k >= ctx.vocab, lambda: logits, cut)  # the search costs ~50 passes: skip it when off

  return Stage("top_k", (setting,), on_candidates, on_row)


def top_p(p: float = 0.95) -> Stage:
  """Nucleus sampling: keeps the shortest prefix whose probability reaches ``p``.

  Probabilities are the softmax of the current survivors; the token that
  crosses ``p`` is kept, and so is the best token whatever ``p`` is.
  ``p >= 1`` keeps all.

  Args:
    p: ``top_p``, in ``(0, 1]``.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_p(0.5), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
    >>> token, _ = sampler.pick(logits, sampler.init(seed=3))
    >>> int(token) in (0, 1)  # 0.4 < 0.5, so the crossing token 1 survives too
    True

  References:
    Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration".
  """
  setting = Setting("top_p", p, jnp.float32, lambda v: (v > 0) & (v <= 1), "in (0, 1]")

  def on_candidates(c: Candidates, s: dict, ctx: Context) -> Candidates:
    p = s["top_p"]
    log_total = c.log_total()
    probs = jnp.exp(c.logits - log_total)
    reached = (jnp.cumsum(probs) >= p) & (c.logits > -jnp.inf)
    crossing = jnp.argmax(reached)
    found = jnp.any(reached)
    off = p >= 1
    index = jnp.arange(c.ids.shape[0])
    # Not reached within the candidates: all of them survive, and so may
    # tokens beyond; a later stage (min-p) may still settle the row.
    cut = c.keep(off | ~found | (index <= crossing))
    return cut._replace(
      complete=c.complete | (found & ~off),
      exact=c.exact & (off | ~jnp.isnan(log_total)),
    )

  def on_row(logits: jax.Array, s: dict, ctx: Context) -> jax.Array:
    p = s["top_p"]

    def cut():
      keep = shortest_prefix(logits, jnp.exp(logits - logsumexp(logits)), p)
      return jnp.where(keep, logits, -jnp.inf)

    return lax.cond(p >= 1, lambda: logits, cut)

  return Stage("top_p", (setting,), on_candidates, on_row)


def min_p(p: float = 0.05) -> Stage:
  """Keeps tokens at least ``p`` times as likely as the best one.

  That is ``logit >= max + log(p)``; ``p <= 0`` keeps all.

  Args:
    p: ``min_p``, in ``[0, 1]``.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.min_p(0.5), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.2]))
    >>> token, _ = sampler.pick(logits, sampler.init(seed=1))
    >>> int(token) in (0, 1)  # 0.2 < 0.5 * 0.5 is cut
    True

  References:
    Nguyen et al., 2024, "Turning Up the Heat: Min-p Sampling for Creative and
    Coherent LLM Outputs".
  """
  setting = Setting("min_p", p, jnp.float32, lambda v: (v >= 0) & (v <= 1), "in [0, 1]")

  def threshold(logits: jax.Array, s: dict) -> jax.Array:
    p = jnp.minimum(s["min_p"], 1.0)  # above 1 not even the best would survive
    return jnp.where(p > 0, jnp.max(logits) + jnp.log(jnp.maximum(p, 1e-38)), -jnp.inf)

  def on_candidates(c: Candidates, s: dict, ctx: Context) -> Candidates:
    floor = threshold(c.logits, s)
    last = c.logits[-1]
    # Tokens outside the candidates rank below the last one, so if it falls
    # under the threshold (and is still a survivor), so do they.
    settled = c.complete | ((last > -jnp.inf) & (last < floor))
    removed = jnp.any((c.logits > -jnp.inf) & (c.logits < floor))
    return c.keep(c.logits >= floor)._replace(
      complete=settled,
      total=jnp.where(removed & ~settled, jnp.nan, c.total),
    )

  def on_row(logits: jax.Array, s: dict, ctx: Context) -> jax.Array:
    cut = lambda: jnp.where(logits >= threshold(logits, s), logits, -jnp.inf)  # noqa: E731
    return lax.cond(s["min_p"] > 0, cut, lambda: logits)

  return Stage("min_p", (setting,), on_candidates, on_row)
