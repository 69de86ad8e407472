"""New tokens since the prompt: a stage's own count of the tokens drawn or accepted after it.

``SamplerState.position`` counts every token, prompt included, and the window
does not say which of its tokens came from the prompt. Stages that need to know
(``min_tokens``, OpenAI-scoped penalties) keep :class:`Generated` as their own
state: the run of positions they saw drawn or accepted (``update`` runs after
every draw and in :meth:`Sampler.accept`). :meth:`Sampler.load_prompt` does not
update stage states, so a prompt moves ``position`` past the run's end, and
that is how a new prompt is recognised: the count starts again at 0.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jsample._src.stage import Context


class Generated(NamedTuple):
  """One row's run of generated positions ``[start, end)``, both ``[]`` int32."""

  start: jax.Array
  end: jax.Array


def init() -> Generated:
  return Generated(jnp.int32(0), jnp.int32(0))


def update(state: Generated, ctx: Context) -> Generated:
  """After a token at ``ctx.position``: the run grows, or a new one starts after a prompt."""
  start = jnp.where(ctx.position == state.end, state.start, ctx.position)
  return Generated(start, ctx.position + 1)


def count(state: Generated, ctx: Context) -> jax.Array:
  """``[]`` int32: tokens generated since the last prompt (0 right after one)."""
  return jnp.where(ctx.position == state.end, state.end - state.start, 0)


def in_window(state: Generated, ctx: Context) -> jax.Array:
  """``[W]`` bool: the window slots that hold generated tokens (the last :func:`count` tokens)."""
  return ctx.ages() < count(state, ctx)
