"""Repetition, frequency and presence penalties over the recent-token window.

Two scopes, chosen per recipe: llama.cpp's (every penalty over the last
``penalty_last_n`` tokens, prompt included) and OpenAI's and vLLM's (repetition
over prompt and generated tokens, frequency and presence over generated tokens
only).
"""

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import lookup
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage
from jsample._src.stages import new_tokens

SCOPES = ("llama.cpp", "openai")


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
  age = ctx.ages()
  return (age < jnp.minimum(last_n, ctx.position)) & (ctx.window >= 0)


def _counter(ids: jax.Array, ctx: Context):
  """``recent [W] -> [N]``: how often each of the candidates ``ids [N]`` occurs in a window (``-1``: no token)."""
  (width,) = ctx.window.shape
  (n,) = ids.shape
  if width <= 128:  # comparing every pair is cheapest for short windows
    return lambda recent: jnp.sum(ids[:, None] == recent[None, :], axis=1)
  found = lookup.index(ids, ctx.vocab)  # once for both windows of OpenAI's scope

  def counts(recent):
    slot, hit = lookup.find(found, recent, recent >= 0, branch_free=ctx.branch_free)
    return jnp.zeros(n, jnp.int32).at[jnp.where(hit, slot, n)].add(1, mode="drop")

  return counts


def _usable(s: Settings) -> jax.Array:
  """Whether the weights are ones ``init`` accepts. Traced weights can be anything:
  a row with a repeat penalty <= 0 or NaN, or a non-finite weight, gets no
  penalties (its logits would turn NaN); ``Sampler.checked`` reports it."""
  repeat = s["repeat_penalty"]
  weights = jnp.isfinite(s["frequency_penalty"]) & jnp.isfinite(s["presence_penalty"])
  return (repeat > 0) & jnp.isfinite(repeat) & weights


def _penalise(logits: jax.Array, count: jax.Array, fresh: jax.Array | None, s: Settings) -> jax.Array:
  """The penalties of tokens seen ``count`` times in the window, ``fresh`` of them generated.

  ``fresh`` None: llama.cpp's arithmetic, ``logit - (count * frequency +
  presence)`` over every occurrence. Otherwise vLLM's (``apply_penalties``):
  the repeat penalty for any occurrence, then ``- fresh * frequency``, then
  ``- presence`` if ``fresh > 0``, two float32 subtractions.
  """
  repeat = s["repeat_penalty"]
  scaled = jnp.where(logits <= 0, logits * repeat, logits / repeat)
  usable = _usable(s)
  seen = (count > 0) & usable
  if fresh is None:
    shift = count.astype(jnp.float32) * s["frequency_penalty"] + seen.astype(jnp.float32) * s["presence_penalty"]
    out = jnp.where(seen, scaled - shift, logits)
  else:
    made = (fresh > 0) & usable
    out = jnp.where(seen, scaled, logits)
    out = jnp.where(made, out - fresh.astype(jnp.float32) * s["frequency_penalty"], out)
    out = jnp.where(made, out - s["presence_penalty"], out)
  # Stay within the cleaned row's range: a raised logit stops at the largest
  # float, not +inf (whose softmax is NaN); inf - inf counts as removed, like
  # NaN logits; a removed token stays removed.
  out = jnp.where(jnp.isnan(out), -jnp.inf, jnp.minimum(out, jnp.finfo(jnp.float32).max))
  return jnp.where(logits > -jnp.inf, out, -jnp.inf)


def _neutral(s: Settings) -> jax.Array:
  return (s["repeat_penalty"] == 1) & (s["frequency_penalty"] == 0) & (s["presence_penalty"] == 0)


def _active(s: Settings, ctx: Context) -> jax.Array:
  return jnp.any(_recent(s, ctx)) & ~_neutral(s) & _usable(s)


def penalties(
  repeat: float = 1.0,
  frequency: float = 0.0,
  presence: float = 0.0,
  last_n: int = -1,
  *,
  scope: Literal["llama.cpp", "openai"] = "llama.cpp",
) -> Stage:
  """Penalises tokens seen in the last ``last_n`` tokens of the window.

  With ``scope="llama.cpp"`` (llama.cpp's arithmetic), for a token seen
  ``c > 0`` times: ``logit / repeat`` if the logit is positive, else
  ``logit * repeat``; then ``logit -= c * frequency + presence``. The window
  includes the prompt once :meth:`Sampler.load_prompt` has loaded it.

  With ``scope="openai"`` (OpenAI's and vLLM's ``apply_penalties``), the
  repeat penalty applies as above to every token seen in the window, prompt
  or generated; frequency and presence count only generated tokens, ``g > 0``
  of them: ``logit -= g * frequency``, then ``logit -= presence``. Generated
  means drawn or accepted since the last prompt (the stage counts them in its
  own state, see :func:`jsample.min_tokens`). Unlike vLLM, which reads the
  whole prompt and every output token, only the last ``window_size`` tokens
  are seen (and of those the last ``last_n``): a window at least as long as
  prompt plus output gives vLLM's penalties exactly.

  The stage touches the window's tokens only, so it runs before the cut on
  the ``K`` best other tokens plus the window's own: exact for any weights,
  those that raise logits included.

  Args:
    repeat: ``repeat_penalty``, > 0; 1 is neutral (vLLM's
      ``repetition_penalty``).
    frequency: ``frequency_penalty``; 0 is neutral.
    presence: ``presence_penalty``; 0 is neutral.
    last_n: ``penalty_last_n``, how many recent tokens count; 0 turns the
      stage off, -1 means the whole window.
    scope: ``"llama.cpp"`` or ``"openai"`` (static).

  Returns:
    A :class:`Stage` that acts before the cut to ``K`` candidates.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.penalties(repeat=2.0), jsample.temperature(0.0), window_size=4)
    >>> state = sampler.init(seed=0, prompt=[2])
    >>> token, state = sampler.pick(jnp.array([0.0, 1.0, 1.5]), state)
    >>> int(token)  # token 2 is penalised to 0.75, so token 1 wins
    1

    OpenAI's scope: a presence penalty for generated tokens only.

    >>> sampler = jsample.chain(jsample.penalties(presence=1.0, scope="openai"), jsample.temperature(0.0))
    >>> state = sampler.init(seed=0, prompt=[2])
    >>> token, state = sampler.pick(jnp.array([0.0, 1.0, 1.5]), state)
    >>> int(token)  # the prompt's token 2 is not penalised
    2
    >>> token, state = sampler.pick(jnp.array([0.0, 1.0, 1.5]), state)
    >>> int(token)  # now it was generated: 1.5 - 1 = 0.5
    1

  References:
    Keskar et al., 2019, "CTRL: A Conditional Transformer Language Model for
    Controllable Generation" (repetition penalty).
  """
  if scope not in SCOPES:
    raise ValueError(f"scope: must be one of {SCOPES}; got {scope!r}")
  openai = scope == "openai"

  def touches(s: Settings, ctx: Context) -> jax.Array:
    return jnp.where(_recent(s, ctx) & _active(s, ctx), ctx.window, -1)

  def fresh(s: Settings, ctx: Context) -> jax.Array:
    """``[W]`` the window's generated tokens among the recent ones (``-1``: none)."""
    return jnp.where(_recent(s, ctx) & new_tokens.in_window(ctx.state, ctx), ctx.window, -1)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    counts = _counter(c.ids, ctx)
    count = counts(touches(s, ctx))
    made = counts(fresh(s, ctx)) if openai else None
    active = _active(s, ctx)
    return c._replace(logits=_penalise(c.logits, count, made, s), log_z_known=c.log_z_known & ~active)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    (width,) = logits.shape

    def counts(ids):
      slots = jnp.where(ids >= 0, ids - ctx.offset, width)
      slots = jnp.where((slots >= 0) & (slots < width), slots, width)
      return jnp.zeros(width, jnp.int32).at[slots].add(1, mode="drop")

    def penalise():
      made = counts(fresh(s, ctx)) if openai else None
      return _penalise(logits, counts(touches(s, ctx)), made, s)

    return lax.cond(_active(s, ctx), penalise, lambda: logits)  # skip two passes over V when off

  def lowers(s: Settings, ctx: Context) -> jax.Array:
    raising = (s["repeat_penalty"] < 1) | (s["frequency_penalty"] < 0) | (s["presence_penalty"] < 0)
    return ~(raising & _active(s, ctx))

  def update(state, token, logprob, s: Settings, ctx: Context):
    return new_tokens.update(state, ctx)

  stage = Stage(
    "penalties",
    _settings(repeat, frequency, presence, last_n),
    on_candidates,
    on_row,
    touches=touches,
    lowers=lowers,
    is_neutral=lambda s: _neutral(s) | (s["penalty_last_n"] == 0),
  )
  return stage._replace(init_state=new_tokens.init, update=update) if openai else stage
