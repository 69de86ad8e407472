"""What each stage of a chain does to a batch of rows: :meth:`Sampler.explain`'s views, on the full path."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src import draw, paths, run
from jsample._src.state import SamplerState


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=["survivors", "entropy", "ids", "probs"], meta_fields=["name"]
)
@dataclasses.dataclass(frozen=True)
class StageView:
  """One stage's effect on a batch of rows, from :meth:`Sampler.explain`; a pytree (``name`` is static).

  Attributes:
    name: the stage (``"input"`` for the cleaned, masked row before any stage).
    survivors: ``[B]`` int32 tokens still alive.
    entropy: ``[B]`` float32 entropy in nats of the distribution at that point.
    ids: ``[B, n]`` int32 the ``n`` most likely tokens, in sampling order.
    probs: ``[B, n]`` float32 their probabilities at that point.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
    >>> views = sampler.explain(jnp.log(jnp.array([[0.2, 0.5, 0.3]])), sampler.init(seed=[0]), top=2)
    >>> [(view.name, int(view.survivors[0])) for view in views]
    [('input', 3), ('top_k', 2), ('temperature', 2)]
  """

  name: str
  survivors: jax.Array
  entropy: jax.Array
  ids: jax.Array
  probs: jax.Array


def views(sampler, logits, state: SamplerState, inputs: dict, top: int) -> list[StageView]:
  """A :class:`StageView` of the input row and one after each stage, on the full path."""
  (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, inputs)
  vocab = raw.shape[-1]
  n = min(top, vocab)

  def one(raw, mask, row):
    x = paths.full_path((), raw, mask, row, strategy)
    seen = [_view(x, n)]
    for stage in sampler.stages:
      x = stage.on_row(x, row.settings, paths.context(stage, row, vocab, strategy))
      seen.append(_view(x, n))
    return seen

  seen = jax.vmap(one)(raw, mask, rows)
  if single:
    seen = jax.tree.map(lambda a: a[0], seen)
  names = ("input",) + tuple(stage.name for stage in sampler.stages)
  return [StageView(name, *view) for name, view in zip(names, seen, strict=True)]


def _view(x: jax.Array, n: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  p = draw.softmax(x)
  entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
  best, ids = lax.top_k(p, n)
  return jnp.sum(x > -jnp.inf, dtype=jnp.int32), entropy, ids.astype(jnp.int32), best
