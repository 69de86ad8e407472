"""Repetition, frequency and presence penalties over the recent-token window."""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.stage import Candidates, Context, Setting, Settings, Stage


def _settings(repeat, frequency, presence, last_n):
  return (
    Setting(
      "repeat_penalty",
      repeat,
      jnp.float32,
      lambda v: jnp.isfinite(v) & (v > 0),
      "finite and > 0",
      1.0,
      "divide positive logits of recent tokens by it, multiply negative ones (llama.cpp's repeat penalty)",
    ),
    Setting(
      "frequency_penalty",
      frequency,
      jnp.float32,
      jnp.isfinite,
      "finite",
      0.0,
      "subtract it once per occurrence of a token in the recent window",
    ),
    Setting(
      "presence_penalty",
      presence,
      jnp.float32,
      jnp.isfinite,
      "finite",
      0.0,
      "subtract it once from every token present in the recent window",
    ),
    Setting(
      "penalty_last_n",
      last_n,
      jnp.int32,
      lambda v: v >= -1,
      ">= -1 (-1: the whole window)",
      0,
      "how many recent tokens the penalties look at (0: off, -1: the whole window)",
      at_most="window_size",
    ),
  )


def _recent(s: Settings, ctx: Context) -> jax.Array:
  """``[W]`` bool: which window slots hold one of the last ``penalty_last_n`` tokens."""
  (width,) = ctx.window.shape
  last_n = s["penalty_last_n"]
  last_n = jnp.where(last_n < 0, width, jnp.minimum(last_n, width))
  age = jnp.mod(ctx.position - 1 - jnp.arange(width, dtype=jnp.int32), width)
  return (age < jnp.minimum(last_n, ctx.position)) & (ctx.window >= 0)


def _counts(ids: jax.Array, recent: jax.Array) -> jax.Array:
  """How often each of ``ids [N]`` occurs in ``recent [W]`` (``-1``: no token)."""
  (width,) = recent.shape
  if width <= 128:  # comparing every pair is cheapest for short windows
    return jnp.sum(ids[:, None] == recent[None, :], axis=1)
  ordered = jnp.sort(recent)
  # A binary search: a fixed-length loop, cheap on a CPU; the accelerator's
  # structural test covers windows of up to 128, which compare every pair.
  count = functools.partial(jnp.searchsorted, ordered, ids)
  return count(side="right") - count(side="left")


def _usable(s: Settings) -> jax.Array:
  """Whether the weights are ones ``init`` accepts. Traced weights can be anything:
  a row with a repeat penalty <= 0 or NaN, or a non-finite weight, gets no
  penalties (its logits would turn NaN); ``Sampler.checked`` reports it."""
  repeat = s["repeat_penalty"]
  weights = jnp.isfinite(s["frequency_penalty"]) & jnp.isfinite(s["presence_penalty"])
  return (repeat > 0) & jnp.isfinite(repeat) & weights


def _penalise(logits: jax.Array, count: jax.Array, s: Settings) -> jax.Array:
  """llama.cpp's arithmetic, for tokens seen ``count`` times in the window."""
  repeat = s["repeat_penalty"]
  scaled = jnp.where(logits <= 0, logits * repeat, logits / repeat)
  seen = (count > 0) & _usable(s)
  shift = count.astype(jnp.float32) * s["frequency_penalty"] + seen.astype(jnp.float32) * s["presence_penalty"]
  out = jnp.where(seen, scaled - shift, logits)
  # Stay within the cleaned row's range: a raised logit stops at the largest
  # float, not +inf (whose softmax is NaN); inf - inf counts as removed, like
  # NaN logits; a removed token stays removed.
  out = jnp.where(jnp.isnan(out), -jnp.inf, jnp.minimum(out, jnp.finfo(jnp.float32).max))
  return jnp.where(logits > -jnp.inf, out, -jnp.inf)


def _active(s: Settings, ctx: Context) -> jax.Array:
  neutral = (s["repeat_penalty"] == 1) & (s["frequency_penalty"] == 0) & (s["presence_penalty"] == 0)
  return jnp.any(_recent(s, ctx)) & ~neutral & _usable(s)


def penalties(repeat: float = 1.0, frequency: float = 0.0, presence: float = 0.0, last_n: int = -1) -> Stage:
  """Penalises tokens seen in the last ``last_n`` tokens of the window.

  For a token seen ``c > 0`` times: ``logit / repeat`` if the logit is
  positive, else ``logit * repeat``; then ``logit -= c * frequency + presence``
  (llama.cpp's arithmetic). The window includes the prompt once
  :meth:`Sampler.load_prompt` has loaded it.

  The stage touches the window's tokens only, so it runs before the cut on
  the ``K`` best other tokens plus the window's own: exact for any weights,
  those that raise logits included.

  Args:
    repeat: ``repeat_penalty``, > 0; 1 is neutral.
    frequency: ``frequency_penalty``; 0 is neutral.
    presence: ``presence_penalty``; 0 is neutral.
    last_n: ``penalty_last_n``, how many recent tokens count; 0 turns the
      stage off, -1 means the whole window.

  Returns:
    A :class:`Stage` that acts before the cut to ``K`` candidates.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.penalties(repeat=2.0), jsample.temperature(0.0), window_size=4)
    >>> state = sampler.init(seed=0, prompt=[2])
    >>> token, state = sampler.pick(jnp.array([0.0, 1.0, 1.5]), state)
    >>> int(token)  # token 2 is penalised to 0.75, so token 1 wins
    1

  References:
    Keskar et al., 2019, "CTRL: A Conditional Transformer Language Model for
    Controllable Generation" (repetition penalty).
  """

  def touches(s: Settings, ctx: Context) -> jax.Array:
    return jnp.where(_recent(s, ctx), ctx.window, -1)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    count = _counts(c.ids, touches(s, ctx))
    active = _active(s, ctx)
    return c._replace(logits=_penalise(c.logits, count, s), log_z_known=c.log_z_known & ~active)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    def penalise():
      (width,) = logits.shape
      slots = jnp.where(_recent(s, ctx), ctx.window - ctx.offset, width)
      slots = jnp.where((slots >= 0) & (slots < width), slots, width)
      count = jnp.zeros(width, jnp.int32).at[slots].add(1, mode="drop")
      return _penalise(logits, count, s)

    return lax.cond(_active(s, ctx), penalise, lambda: logits)  # skip two passes over V when off

  return Stage("penalties", _settings(repeat, frequency, presence, last_n), on_candidates, on_row, touches=touches)
