"""Token-id lists: the only ids a row may draw (vLLM's ``allowed_token_ids``), and ids it never draws
(a logit bias of ``-inf``)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.stage import Candidates, Context, Settings, Stage
from jsample._src.stages._id_lists import ban_stage, id_list, listed, slots


def allowed_tokens(ids: Sequence[int] = (), *, size: int = 64) -> Stage:
  """Draws only among the listed token ids; an empty list (all ``-1``) allows every token.

  A list is a sparse mask: it removes every other token, before any other
  stage. The stage declares the listed ids as the ids it touches, so the cut
  keeps all of them beside the ``K`` best raw tokens, whatever their rank (the
  raw best may hold none of them). On candidates it removes every other id
  and marks the candidates as covering the row: no token outside them survives, so the
  row settles without the full-vocabulary path unless more than ``K``
  listed tokens survive. ``O((K + N) N)`` on candidates; on a row, one
  scatter of ``N`` ids and one select over ``V``, skipped for rows whose
  list is empty.

  Ids outside ``[0, V)`` name no token: a list holding only such ids allows
  nothing, and the row comes back with ``valid=False``.

  Args:
    ids: the default ``allowed_token_ids`` of every row; rows override them
      in ``init`` with ``[size]`` (or ``[B, size]``) lists padded with ``-1``.
    size: ``N``, the longest list a row can hold (static).

  Returns:
    A :class:`Stage` that acts before the cut.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.allowed_tokens(size=3), jsample.temperature(0.0))
    >>> state = sampler.init(seed=0, allowed_token_ids=[[1, 3, -1], [-1, -1, -1]])
    >>> tokens, state = sampler.pick(jnp.array([[4.0, 1.0, 2.0, 3.0], [4.0, 1.0, 2.0, 3.0]]), state)
    >>> tokens.tolist()  # row 0 draws among 1 and 3; row 1's empty list allows all
    [3, 0]
  """
  setting = id_list("allowed_token_ids", ids, size, "the only token ids that may be drawn (-1 pads; none: all)")

  def touches(s: Settings, ctx: Context) -> jax.Array:
    return s["allowed_token_ids"]

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    allowed = s["allowed_token_ids"]
    on = jnp.any(allowed >= 0)
    # The cut put every listed id among the candidates, so what survives here is all that survives.
    return c._replace(
      logits=jnp.where(on & ~listed(c.ids, allowed), -jnp.inf, c.logits),
      covers_row=c.covers_row | on,
      log_z_known=c.log_z_known & ~on,
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    allowed = s["allowed_token_ids"]
    (width,) = logits.shape

    def keep():
      kept = jnp.zeros(width, bool).at[slots(allowed, ctx, width)].set(True, mode="drop")
      return jnp.where(kept, logits, -jnp.inf)

    return lax.cond(jnp.any(allowed >= 0), keep, lambda: logits)

  def is_neutral(s: Settings) -> jax.Array:
    return jnp.all(s["allowed_token_ids"] < 0)

  return Stage("allowed_tokens", (setting,), on_candidates, on_row, touches=touches, is_neutral=is_neutral)


def banned_tokens(ids: Sequence[int] = (), *, size: int = 16) -> Stage:
  """Never draws the listed token ids (HF's ``suppress_tokens``, a logit bias of ``-inf``).

  Args:
    ids: the default ``banned_token_ids`` of every row; rows override them
      in ``init`` with ``[size]`` (or ``[B, size]``) lists padded with ``-1``.
    size: the longest list a row can hold (static).

  Returns:
    A :class:`Stage` that acts before the cut, on the listed ids only.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.banned_tokens(size=2), jsample.temperature(0.0))
    >>> state = sampler.init(seed=0, banned_token_ids=[[2, -1], [2, 1]])
    >>> tokens, state = sampler.pick(jnp.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]), state)
    >>> tokens.tolist()
    [1, 0]
  """
  setting = id_list("banned_token_ids", ids, size, "token ids never to draw (-1 pads the list)")
  return ban_stage(
    "banned_tokens",
    (setting,),
    lambda s, ctx: s["banned_token_ids"],
    is_neutral=lambda s: jnp.all(s["banned_token_ids"] < 0),
  )
