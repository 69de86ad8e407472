"""The two paths of a draw: the chain on ``K`` candidates after one cut, and on the full row.

The candidate path does all ``O(V)`` work in the cut (:mod:`cut`) and the row
statistics, then runs the stages on ``K`` candidates. It says, per row, when
``K`` candidates cannot decide (``Candidates.exact``, ``complete``); those rows
take the full-vocabulary path, which runs every stage's ``on_row`` on ``[V]``.
How rows are batched, skipped and searched is the :class:`Strategy`'s business.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jsample._src import cut
from jsample._src.stage import Candidates, Context, Stage, sort_candidates
from jsample._src.strategy import Strategy, select


class Rows(NamedTuple):
  """What the rows carry into the chain besides their logits and mask; batched over ``B``.

  Attributes:
    settings: name -> ``[B]`` (or ``[B, N]``) values.
    window: ``[B, W]`` recent token ids.
    position: ``[B]`` tokens accepted so far.
    bits: ``[B, 2]`` uint32 step bits.
    inputs: name -> ``[B, ...]`` per-call inputs other than the mask.
    stages: stage name -> per-row state.
  """

  settings: dict[str, jax.Array]
  window: jax.Array
  position: jax.Array
  bits: jax.Array
  inputs: dict[str, jax.Array]
  stages: dict[str, Any]


def context(stage: Stage, row: Rows, vocab: int, strategy: Strategy, stat=None) -> Context:
  """The :class:`Context` one stage sees for one (unbatched) row."""
  return Context(
    window=row.window,
    position=row.position,
    vocab=vocab,
    bits=row.bits,
    inputs={name: row.inputs[name] for name in stage.inputs},
    state=row.stages.get(stage.name),
    stat=stat,
    search=strategy.search,
  )


def stat_stage(stages: tuple[Stage, ...]) -> int | None:
  """The index of the stage whose row statistic is computed: the first that
  declares one (a later one would need the row as changed by that stage)."""
  return next((i for i, stage in enumerate(stages) if stage.row_stat is not None), None)


def candidates(stages: tuple[Stage, ...], budget: int, raw: jax.Array, mask, rows: Rows, strategy: Strategy):
  """The chain on candidates ``[B, K]``: ``(first, refine)``.

  ``first`` runs without the row statistics, which cost passes over ``V``;
  ``refine()`` runs again with them. Each returns the candidates and the rows
  they decide (``exact & complete``); the strategy calls ``refine`` only where
  some row needs it.
  """
  vocab = raw.shape[-1]
  touchers = tuple(stage for stage in stages if stage.touches is not None)
  touched = _touched(touchers, rows, vocab, strategy)
  extra = min(touched.shape[1], budget)
  wide = min(vocab, budget + extra)
  logits, ids = cut.top_candidates(raw, mask, wide, branch_free=strategy.branch_free)
  top = logits[:, 0]  # the cleaned row's best, before any stage
  cut_rows = jax.vmap(functools.partial(_cut_row, touchers, budget, extra, vocab, strategy))
  chain_rows = jax.vmap(functools.partial(_chain_row, stages, vocab, strategy))

  def run(log_z, known, stat) -> tuple[Candidates, jax.Array]:
    c = chain_rows(cut_rows(raw, mask, logits, ids, touched, rows, log_z, known), rows, stat)
    return c, c.exact & c.complete

  def refine():
    log_z = cut.log_normalisers(raw, mask, top, branch_free=strategy.branch_free)
    known = jnp.ones(top.shape, bool)
    c, ok = run(log_z, known, None)
    if stat_stage(stages) is None:
      return c, ok

    def with_stat():  # a second pass over V: only where the log-normaliser did not settle a row
      later, better = run(log_z, known, row_statistic(stages, raw, mask, rows, strategy))
      return select(ok, c, later), ok | better

    return with_stat() if strategy.branch_free else jax.lax.cond(jnp.all(ok), lambda: (c, ok), with_stat)

  unknown = jnp.zeros(top.shape, jnp.float32)
  return run(unknown, unknown > 0, None), refine


def row_statistic(stages, raw, mask, rows: Rows, strategy: Strategy) -> jax.Array:
  """The row statistic ``[B]`` of the first stage that declares one, over the cleaned rows."""
  index = stat_stage(stages)
  assert index is not None
  stage = stages[index]
  vocab = raw.shape[-1]

  def one(r, m, row):
    x = cut.full_row(r, m, branch_free=strategy.branch_free)
    return jnp.asarray(stage.row_stat(x, row.settings, context(stage, row, vocab, strategy)), jnp.float32)

  if strategy.branch_free or not raw.shape[0]:
    return jax.vmap(one)(raw, mask, rows)
  # Row by row on a CPU, so that a statistic a row does not need (its own
  # lax.cond says so) costs it nothing; rows are indexed, not mapped over.
  return jax.lax.map(lambda i: one(*jax.tree.map(lambda a: a[i], (raw, mask, rows))), jnp.arange(raw.shape[0]))


def _touched(touchers, rows: Rows, vocab: int, strategy: Strategy) -> jax.Array:
  """``[B, E]`` the ids the stages before the cut may change (``-1``: none)."""
  if not touchers:
    return jnp.zeros(rows.position.shape + (0,), jnp.int32)

  def one(row):
    parts = [stage.touches(row.settings, context(stage, row, vocab, strategy)) for stage in touchers]
    return jnp.concatenate([jnp.asarray(p, jnp.int32).reshape(-1) for p in parts])

  return jax.vmap(one)(rows)


def _cut_row(
  touchers, budget: int, extra: int, vocab: int, strategy, raw, mask, logits, ids, touched, row: Rows, log_z, known
):
  """The ``K`` best tokens of one row after the stages that act before the cut.

  ``logits, ids`` are the row's ``K + m`` best raw tokens, ``m = min(E, K)``.
  Those stages change only their ``E`` touched ids, so the ``K`` best of the
  changed row are among the touched ids and the ``K`` best untouched tokens,
  which the raw best hold as long as at most ``m`` of them are touched.
  """
  (wide,) = ids.shape
  whole = (wide == vocab) | (logits[-1] == -jnp.inf)  # nothing survives beyond the cut
  c = Candidates(ids, logits, log_z, known, whole, jnp.bool_(True))
  if not touchers:
    return c
  # Touched ids beside the raw best, once each; repeats and ids already there stay empty (id V).
  order = jnp.sort(touched)
  repeat = jnp.concatenate([jnp.zeros(1, bool), order[1:] == order[:-1]])
  ranked = jnp.sort(ids)
  # searchsorted's default is a loop (a scan): compare or sort instead.
  method = "compare_all" if wide * order.shape[0] <= 65536 else "sort"
  found = jnp.take(ranked, jnp.clip(jnp.searchsorted(ranked, order, method=method), 0, wide - 1)) == order
  outside = (order < 0) | (order >= vocab)
  empty = repeat | found | outside
  beside = jnp.where(empty, vocab, order)
  c = c._replace(
    ids=jnp.concatenate([ids, beside]),
    logits=jnp.concatenate([logits, jnp.where(empty, -jnp.inf, cut.at(raw, beside, mask))]),
    exact=whole | (jnp.sum(found & ~repeat & ~outside) <= extra),
  )
  for stage in touchers:
    c = stage.on_candidates(c, row.settings, context(stage, row, vocab, strategy))
  sorted_ids, sorted_logits = sort_candidates(c.ids, c.logits)
  kept = min(budget, sorted_ids.shape[0])
  return c._replace(
    ids=sorted_ids[:kept],
    logits=sorted_logits[:kept],
    complete=whole & ((kept == sorted_ids.shape[0]) | (sorted_logits[kept - 1] == -jnp.inf)),
  )


def _chain_row(stages, vocab: int, strategy: Strategy, c: Candidates, row: Rows, stat) -> Candidates:
  """The ``O(K)`` rest of the candidate path, for one row."""
  index = stat_stage(stages)
  for i, stage in enumerate(stages):
    if stage.touches is None:
      known = stat if i == index else None
      c = stage.on_candidates(c, row.settings, context(stage, row, vocab, strategy, known))
  return c


def full_row(stages: tuple[Stage, ...], raw: jax.Array, mask, row: Rows, strategy: Strategy) -> jax.Array:
  """The full-vocabulary path for one row: every stage on ``[V]``, no sort."""
  x = cut.full_row(raw, mask, branch_free=strategy.branch_free)
  for stage in stages:
    x = stage.on_row(x, row.settings, context(stage, row, x.shape[0], strategy))
  return x
