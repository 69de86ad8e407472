"""Logit bias: per-row ``(id, bias)`` pairs added to the logits, ``-inf`` bans (llama.cpp's ``logit_bias``)."""

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src.stage import Candidates, Context, Setting, Settings, Stage
from jsample._src.stages._id_lists import id_list, slots


def _biases(s: Settings) -> tuple[jax.Array, jax.Array]:
  """``(ids [N], biases [N])``; a pair with no id, a zero bias, or a bias ``init``
  refuses (NaN, +inf: possible only in a traced state) counts as no pair."""
  ids, bias = s["logit_bias_ids"], s["logit_bias_values"]
  used = (ids >= 0) & (bias != 0) & (bias < jnp.inf)
  return jnp.where(used, ids, -1), jnp.where(used, bias, 0.0)


def _add(logits: jax.Array, ids: jax.Array, pair_ids: jax.Array, bias: jax.Array) -> jax.Array:
  """Adds every matching pair's bias to ``logits [n]`` of token ``ids [n]``, in list order.

  float32 and one pair at a time, as llama.cpp does: a repeated id gets each
  of its biases in turn, ``(x + b1) + b2``.
  """
  out = logits
  for j in range(pair_ids.shape[0]):
    out = jnp.where(ids == pair_ids[j], out + bias[j], out)
  # Stay in the cleaned row's range: up to the largest float; a removed token
  # stays removed (-inf plus any bias), and so does -inf + inf's NaN.
  out = jnp.where(jnp.isnan(out), -jnp.inf, jnp.minimum(out, jnp.finfo(jnp.float32).max))
  return jnp.where(logits > -jnp.inf, out, -jnp.inf)


def logit_bias(biases: Mapping[int, float] | None = None, *, size: int = 16) -> Stage:
  """Adds a per-row bias to chosen token ids; a bias of ``-inf`` bans the token.

  ``logit += bias`` in float32, pair by pair in list order (a repeated id gets
  every bias of its pairs), before any other stage, as llama.cpp's
  ``logit_bias`` sampler does. It changes only the listed ids, so it acts
  before the cut with them beside the ``K`` best: exact for any bias, raising
  ones included, and ``O((K + N) N)`` on candidates.

  Args:
    biases: the default ``{token id: bias}`` of every row (OpenAI's and
      llama-server's ``logit_bias``); rows override it in ``init`` with
      ``logit_bias_ids`` and ``logit_bias_values``, ``[size]`` (or
      ``[B, size]``) each, ids padded with ``-1``.
    size: ``N``, the most pairs a row can hold (static).

  Returns:
    A :class:`Stage` that acts before the cut, on the listed ids only.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.logit_bias(size=2), jsample.temperature(0.0))
    >>> state = sampler.init(seed=0, logit_bias_ids=[0, 2], logit_bias_values=[1.5, -jnp.inf])
    >>> token, state = sampler.pick(jnp.array([0.0, 1.0, 2.0]), state)
    >>> int(token)  # token 2 is banned, token 0 rises to 1.5
    0
  """
  pairs = dict(biases or {})
  if len(pairs) > size:
    raise ValueError(f"biases: at most size={size} pairs; got {len(pairs)}")
  ids = id_list("logit_bias_ids", list(pairs), size, "token ids to bias (-1 pads the list)")
  values = Setting(
    "logit_bias_values",
    np.array(list(pairs.values()) + [0.0] * (size - len(pairs)), np.float32),
    jnp.float32,
    lambda v: v < jnp.inf,
    "finite or -inf (-inf bans the token)",
    np.zeros(size, np.float32),
    "the bias added to the logit of the id at the same place in logit_bias_ids",
    (size,),
  )

  def touches(s: Settings, ctx: Context) -> jax.Array:
    return _biases(s)[0]

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    pair_ids, bias = _biases(s)
    active = jnp.any(pair_ids >= 0)
    return c._replace(logits=_add(c.logits, c.ids, pair_ids, bias), log_z_known=c.log_z_known & ~active)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    pair_ids, bias = _biases(s)
    (width,) = logits.shape

    def add():  # gather the listed ids, bias them as on candidates, scatter them back
      at = slots(pair_ids, ctx, width)
      got = jnp.take(logits, jnp.minimum(at, width - 1))
      return logits.at[at].set(_add(got, pair_ids, pair_ids, bias), mode="drop")

    return lax.cond(jnp.any(pair_ids >= 0), add, lambda: logits)

  def lowers(s: Settings, ctx: Context) -> jax.Array:
    pair_ids, bias = _biases(s)
    return jnp.all((pair_ids < 0) | (bias <= 0))

  def is_neutral(s: Settings) -> jax.Array:
    return jnp.all(_biases(s)[0] < 0)

  return Stage(
    "logit_bias", (ids, values), on_candidates, on_row, touches=touches, lowers=lowers, is_neutral=is_neutral
  )
