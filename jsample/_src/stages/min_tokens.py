"""A minimum of new tokens: end-of-sequence ids are banned until a row has generated enough (vLLM's ``min_tokens``)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jsample._src.stage import Context, Setting, Settings, Stage
from jsample._src.stages import new_tokens
from jsample._src.stages._id_lists import ban_stage, id_list


def min_tokens(n: int = 0, eos: Sequence[int] = (), *, size: int = 4) -> Stage:
  """Bans a row's end-of-sequence ids while it has generated fewer than ``min_tokens`` tokens.

  New tokens are counted by the stage's own state (:mod:`new_tokens`): every
  token drawn by :meth:`Sampler.pick` or given to :meth:`Sampler.accept` since
  the last prompt (``init(prompt=...)`` or :meth:`Sampler.load_prompt`) counts,
  so load prompts that way, not token by token through ``accept``. While the
  count is below ``min_tokens`` the row's ``eos_token_ids`` get ``-inf``
  (vLLM bans its EOS and stop-token ids the same way), changing only those ids
  (a ban before the cut, exact on candidates).

  Args:
    n: the default ``min_tokens``, >= 0; 0 turns the stage off.
    eos: the default ``eos_token_ids`` (the model's end-of-generation ids and
      any stop-token ids); rows override them with ``[size]`` lists padded
      with ``-1``.
    size: the longest list of end-of-sequence ids a row can hold (static).

  Returns:
    A :class:`Stage` that acts before the cut and keeps a count of its own.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.min_tokens(2, eos=[1]), jsample.temperature(0.0))
    >>> state = sampler.init(seed=0, prompt=[0, 2])
    >>> logits = jnp.array([0.0, 5.0, 1.0])  # end-of-sequence (1) is the best token
    >>> tokens = []
    >>> for _ in range(3):
    ...   token, state = sampler.pick(logits, state)
    ...   tokens.append(int(token))
    >>> tokens
    [2, 2, 1]
  """
  count = Setting(
    "min_tokens",
    n,
    jnp.int32,
    lambda v: v >= 0,
    ">= 0",
    0,
    "ban the end-of-sequence ids until this many new tokens have been generated",
  )
  ids = id_list("eos_token_ids", eos, size, "the end-of-sequence ids that min_tokens bans (-1 pads the list)")

  def banned(s: Settings, ctx: Context) -> jax.Array:
    early = new_tokens.count(ctx.state, ctx) < s["min_tokens"]
    return jnp.where(early, s["eos_token_ids"], -1)

  def update(state, token, logprob, s: Settings, ctx: Context):
    return new_tokens.update(state, ctx)

  def is_neutral(s: Settings) -> jax.Array:
    return (s["min_tokens"] <= 0) | jnp.all(s["eos_token_ids"] < 0)

  return ban_stage("min_tokens", (count, ids), banned, init_state=new_tokens.init, update=update, is_neutral=is_neutral)
