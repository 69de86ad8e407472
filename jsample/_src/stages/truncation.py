"""Truncation: top-k, top-p (nucleus) and min-p.

Each keeps a prefix of the row in sampling order (logit descending, ties to
the lower id) and always keeps at least one survivor.
"""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels.rowmath import logsumexp
from jsample._src.kernels.search import shortest_prefix
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, always_valid, elementwise, survivor_rank
from jsample._src.stages._min_keep import min_keep_setting


def _always(s: Settings) -> jax.Array:
  """A :attr:`Stage.argmax_invariant` for truncations, which never drop the best token."""
  return jnp.bool_(True)


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
  setting = Setting(
    "top_k", k, jnp.int32, always_valid, "any integer (<= 0: off)", 0, "keep only the k most likely tokens (<= 0: off)"
  )

  def limit(s: Settings, ctx: Context) -> jax.Array:
    k = s["top_k"]
    return jnp.where((k <= 0) | (k >= ctx.vocab), ctx.vocab, k)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    k = limit(s, ctx)
    (budget,) = c.ids.shape
    fits = k <= budget
    cut = c.keep(survivor_rank(c.logits) <= k)
    return cut._replace(
      covers_row=c.covers_row | fits,
      decided=c.decided & (fits | c.covers_row | (k >= ctx.vocab)),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    k = limit(s, ctx)

    def cut():
      keep = shortest_prefix(logits, (logits > -jnp.inf).astype(jnp.int32), k)
      return jnp.where(keep, logits, -jnp.inf)

    return lax.cond(k < ctx.vocab, cut, lambda: logits)  # the search costs ~50 passes: skip it when off

  return Stage(
    "top_k", (setting,), on_candidates, on_row, only_best=lambda s: s["top_k"] == 1, argmax_invariant=_always
  )


def _cut_row(logits: jax.Array, on: jax.Array, least: jax.Array, keep, ctx: Context) -> jax.Array:
  """A threshold's cut of a full row: ``logits`` where not ``on``, else the tokens ``keep()`` marks with the
  ``least`` best restored (``min_keep``).

  The search for the ``least`` best costs passes over the row, so rows with ``least <= 1`` skip it: a cut that
  keeps the best token already keeps one. Only the mask comes out of that ``lax.cond``, never the row: on XLA's
  CPU backend a branch that returns a row from a nested ``lax.cond`` copies it.
  """

  def cut():
    alive = (logits > -jnp.inf).astype(jnp.int32)
    best = lax.cond(least > 1, lambda: shortest_prefix(logits, alive, least), lambda: jnp.zeros(logits.shape, bool))
    return jnp.where(keep() | best, logits, -jnp.inf)

  return lax.cond(on, cut, lambda: logits)


def top_p(p: float = 0.95, min_keep: int = 0) -> Stage:
  """Nucleus sampling: keeps the shortest prefix whose probability reaches ``p``.

  Probabilities are the softmax of the current survivors; the token that
  crosses ``p`` is kept, and so is the best token whatever ``p`` is.
  ``p >= 1`` keeps all. The prefix holds at least ``min_keep`` tokens, as
  llama.cpp's (``cum >= p`` and ``i + 1 >= min_keep``).

  Args:
    p: ``top_p``, in ``(0, 1]``.
    min_keep: ``min_keep``, shared with the other stages that take it.

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
  setting = Setting(
    "top_p",
    p,
    jnp.float32,
    lambda v: (v > 0) & (v <= 1),
    "in (0, 1]",
    1.0,
    "keep the most likely tokens whose probabilities add up to p (nucleus sampling)",
  )

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    p, least = s["top_p"], s["min_keep"]
    log_z, known = c.log_normaliser()
    probs = jnp.exp(c.logits - log_z)  # where unknown, the row is not decided anyway
    rank = survivor_rank(c.logits)
    reached = (jnp.cumsum(probs) >= p) & (c.logits > -jnp.inf) & (rank >= least)
    crossing = jnp.argmax(reached)
    found = jnp.any(reached)
    off = p >= 1
    index = jnp.arange(c.ids.shape[0])
    # Not reached within the candidates (the mass, or min_keep tokens): all
    # of them survive, and so may tokens beyond; a later stage (min-p) may
    # still make them cover the row.
    cut = c.keep(off | ~found | (index <= crossing))
    return cut._replace(
      covers_row=c.covers_row | (found & ~off),
      decided=c.decided & (off | known),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    p = s["top_p"]

    def cut():
      probs = jnp.exp(logits - logsumexp(logits))
      keep = shortest_prefix(logits, probs, p, s["min_keep"], branch_free=ctx.branch_free)
      return jnp.where(keep, logits, -jnp.inf)

    return lax.cond(p < 1, cut, lambda: logits)

  return Stage("top_p", (setting, min_keep_setting(min_keep)), on_candidates, on_row, argmax_invariant=_always)


def min_p(p: float = 0.05, min_keep: int = 0) -> Stage:
  """Keeps tokens at least ``p`` times as likely as the best one.

  That is ``logit >= max + log(p)``; ``p <= 0`` keeps all. The ``min_keep``
  best tokens survive whatever ``p`` is, as in llama.cpp.

  Args:
    p: ``min_p``, in ``[0, 1]``.
    min_keep: ``min_keep``, shared with the other stages that take it.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.min_p(0.5), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.2]))
    >>> token, _ = sampler.pick(logits, sampler.init(seed=1))
    >>> int(token) in (0, 1)  # 0.2 < 0.5 * 0.5 is cut
    True
    >>> p = sampler.probs(logits, sampler.init(seed=1, min_keep=3))
    >>> int((p > 0).sum())  # min_keep = 3 keeps the three best
    3

  References:
    Nguyen et al., 2024, "Turning Up the Heat: Min-p Sampling for Creative and
    Coherent LLM Outputs".
  """
  setting = Setting(
    "min_p",
    p,
    jnp.float32,
    lambda v: (v >= 0) & (v <= 1),
    "in [0, 1]",
    0.0,
    "keep tokens at least min_p times as likely as the best one",
  )

  def rule(logits: jax.Array, ids: jax.Array, best: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    p = jnp.minimum(s["min_p"], 1.0)  # above 1 not even the best would survive
    return jnp.where(logits >= best + jnp.log(jnp.maximum(p, 1e-38)), logits, -jnp.inf)

  def covers_row(before: Candidates, after: Candidates, s: Settings) -> jax.Array:
    # Tokens outside the candidates rank below the last one: if the threshold
    # removed it (a survivor before), it removed them too.
    return (before.logits[-1] > -jnp.inf) & (after.logits[-1] == -jnp.inf)

  threshold = elementwise("min_p", (setting,), rule, is_neutral=lambda s: ~(s["min_p"] > 0), covers_row=covers_row)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    after = threshold.on_candidates(c, s, ctx)
    rank = survivor_rank(c.logits)
    least = s["min_keep"]
    # Fewer than min_keep candidates alive, of a row they do not cover: min_keep keeps tokens beyond them.
    short = (rank[-1] < least) & ~c.covers_row
    kept = jnp.where((rank <= least) & (c.logits > -jnp.inf), c.logits, after.logits)
    return after._replace(logits=kept, covers_row=after.covers_row & ~short)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    keep = lambda: rule(logits, ctx.ids(logits.shape[0]), jnp.max(logits), s, ctx) > -jnp.inf  # noqa: E731
    return _cut_row(logits, s["min_p"] > 0, s["min_keep"], keep, ctx)

  return Stage("min_p", (setting, min_keep_setting(min_keep)), on_candidates, on_row, argmax_invariant=_always)
