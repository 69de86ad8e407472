"""Per-row lists of token ids, and the stage that removes listed ids: shared by the token-list stages."""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src.stage import Candidates, Context, Setting, Settings, Stage


def id_list(name: str, ids: Sequence[int], size: int, help: str) -> Setting:
  """A per-row list of up to ``size`` token ids, padded with ``-1``; all ``-1`` is neutral."""
  ids = list(ids)
  if len(ids) > size:
    raise ValueError(f"{name}: at most size={size} ids; got {len(ids)}")
  default = np.array(ids + [-1] * (size - len(ids)), np.int32)
  return Setting(
    name,
    default,
    jnp.int32,
    lambda v: v >= -1,
    ">= -1 (-1 pads the list)",
    np.full(size, -1, np.int32),
    help,
    (size,),
  )


def slots(ids: jax.Array, ctx: Context, width: int) -> jax.Array:
  """Where ``ids`` sit in a row of ``width`` entries; ``width`` (dropped) for -1 and ids outside it."""
  at = ids - ctx.offset
  return jnp.where((ids >= 0) & (at >= 0) & (at < width), at, width)


def listed(ids: jax.Array, lst: jax.Array) -> jax.Array:
  """``[N]`` bool: which of ``ids`` occur in ``lst`` (``-1`` entries match nothing)."""
  return jnp.any((ids[:, None] == lst[None, :]) & (lst[None, :] >= 0), axis=1)


def ban_stage(
  name: str, settings: tuple[Setting, ...], banned: Callable[[Settings, Context], jax.Array], **kw
) -> Stage:
  """A stage that removes the ids ``banned(settings, ctx) -> [E]`` (``-1``: none).

  It changes only those ids, so it acts before the cut with them as its
  touched ids: on candidates it is exact and ``O((K + E) E)``; on a row it
  scatters ``-inf`` into ``E`` slots, and a row with nothing to ban skips it.
  """

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    hit = listed(c.ids, banned(s, ctx))
    # Only a ban of a live token changes the row's normaliser.
    changed = jnp.any(hit & (c.logits > -jnp.inf))
    return c._replace(logits=jnp.where(hit, -jnp.inf, c.logits), log_z_known=c.log_z_known & ~changed)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    ids = banned(s, ctx)
    (width,) = logits.shape
    ban = lambda: logits.at[slots(ids, ctx, width)].set(-jnp.inf, mode="drop")  # noqa: E731
    return lax.cond(jnp.any(ids >= 0), ban, lambda: logits)

  def lowers(s: Settings, ctx: Context) -> jax.Array:
    return jnp.bool_(True)  # a ban only removes

  return Stage(name, settings, on_candidates, on_row, touches=banned, lowers=lowers, **kw)
