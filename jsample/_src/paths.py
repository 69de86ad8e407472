"""The two paths of a draw: the chain on ``K`` candidates after one cut, and on the full row.

The candidate path does all ``O(V)`` work in the cut (:mod:`cut`) and the row
statistics, then runs the stages on ``K`` candidates. It says, per row, when
``K`` candidates cannot decide (``Candidates.decided``, ``covers_row``); those rows
take the full-vocabulary path, which runs every stage's ``on_row`` on ``[V]``.
How rows are batched, skipped and searched is the :class:`Strategy`'s business.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import cut
from jsample._src.kernels.strategy import Strategy, select
from jsample._src.stage import Candidates, Context, Stage


class RowInputs(NamedTuple):
  """What the rows carry into the chain besides their logits and mask: batched over ``B``, or one row's.

  Attributes:
    settings: name -> ``[B]`` (or ``[B, N]``) values.
    window: ``[B, W]`` recent token ids.
    position: ``[B]`` tokens accepted so far.
    step_bits: ``[B, 2]`` uint32, each row's step bits (``fold_in(key, position)``).
    inputs: name -> ``[B, ...]`` per-call inputs other than the mask.
    stages: stage name -> per-row state.
  """

  settings: dict[str, jax.Array]
  window: jax.Array
  position: jax.Array
  step_bits: jax.Array
  inputs: dict[str, jax.Array]
  stages: dict[str, Any]


def context(stage: Stage, row: RowInputs, vocab: int, strategy: Strategy, statistic=jnp.nan) -> Context:
  """The :class:`Context` one stage sees for one (unbatched) row."""
  return Context(
    window=row.window,
    position=row.position,
    vocab=vocab,
    step_bits=row.step_bits,
    inputs={name: row.inputs[name] for name in stage.inputs},
    state=row.stages.get(stage.name),
    row_statistic=statistic,
    branch_free=strategy.branch_free,
  )


def statistic_stage(stages: tuple[Stage, ...]) -> int | None:
  """The index of the stage whose row statistic is computed: the first that
  declares one (a later one would need the row as changed by that stage)."""
  return next((i for i, stage in enumerate(stages) if stage.row_statistic is not None), None)


def candidates(stages: tuple[Stage, ...], budget: int, raw: jax.Array, mask, rows: RowInputs, strategy: Strategy):
  """The chain on candidates ``[B, K]``, as a :class:`CandidatePath`: the cut is made, the chain runs when asked."""
  vocab = raw.shape[-1]
  touched = touched_ids(stages, rows, vocab, strategy)
  logits, ids = cut.top_candidates(raw, mask, cut_width(budget, touched, vocab), branch_free=strategy.branch_free)
  top = logits[:, 0]  # the cleaned row's best, before any stage
  return from_best(
    stages,
    budget,
    vocab,
    rows,
    strategy,
    (logits, ids, touched),
    (raw, mask, _read_row),
    lambda: cut.log_normalisers(raw, mask, top, branch_free=strategy.branch_free),
    lambda: row_statistic(stages, raw, mask, rows, strategy),
  )


class RowEdit(NamedTuple):
  """A row after the stages before the cut, as an edit of the cleaned row: ``logits`` at ``ids`` (id ``V``:
  none), and every other id as cleaned, or ``-inf`` where ``rest_removed`` (a stage removed every id it did
  not touch: allowed ids). Those stages change only the ids they touch, and the cut computed every one.

  Attributes:
    ids: ``[n]`` the cut's raw best and the touched ids, each once.
    logits: ``[n]`` their logits after those stages.
    rest_removed: ``[]`` bool.
  """

  ids: jax.Array
  logits: jax.Array
  rest_removed: jax.Array


class CandidatePath(NamedTuple):
  """The chain on each row's candidates after the cut, run at what is known of the rest of the row.

  Three levels of knowledge, each costlier than the one before: nothing (the first run), the row's
  log-normaliser (a pass over ``V``), and also the row statistic (another). A row is settled where its
  candidates are decided and cover the row.

  Attributes:
    run: ``(log_z [B], log_z_known [B] bool, statistic [B]) -> (candidates, settled [B])``; ``statistic`` is NaN
      where it is not computed.
    log_normalisers: ``() -> [B]``, each cleaned row's ``log Σ exp``.
    statistic: ``() -> [B]``, the row statistic (:func:`row_statistic`), or None where the chain has none or
      none can be had.
    size: ``B``.
    edit: the rows after the stages before the cut (:class:`RowEdit`, batched), which the full path starts
      from instead of running those stages over ``V`` again; None where the cut does not have them all (no
      such stage, or the CPU cut, which may leave out ids that are only lowered).
  """

  run: Callable[[jax.Array, jax.Array, jax.Array], tuple[Candidates, jax.Array]]
  log_normalisers: Callable[[], jax.Array]
  statistic: Callable[[], jax.Array] | None
  size: int
  edit: RowEdit | None = None

  def first(self) -> tuple[Candidates, jax.Array]:
    """The run that knows nothing beyond the candidates: no pass over ``V``."""
    unknown = jnp.full((self.size,), jnp.nan, jnp.float32)
    return self.run(jnp.zeros(self.size, jnp.float32), jnp.zeros(self.size, bool), unknown)

  def settle(self) -> tuple[Candidates, jax.Array]:
    """Each level in turn while some row is not settled, each row keeping the first level that settles it.

    One loop, so that the program holds one copy of the chain, not one per level; its passes over ``V`` run
    only for the levels reached.
    """
    levels = 2 if self.statistic is None else 3
    unknown = jnp.full((self.size,), jnp.nan, jnp.float32)

    def more(carry):
      level, _, settled, _, _ = carry
      return (level == 0) | ((level < levels) & ~jnp.all(settled))

    def level_up(carry):
      level, cands, settled, log_z, statistic = carry
      log_z = lax.cond(level == 1, self.log_normalisers, lambda: log_z)
      if self.statistic is not None:
        statistic = lax.cond(level == 2, self.statistic, lambda: statistic)
      now, ok = self.run(log_z, jnp.broadcast_to(level >= 1, settled.shape), statistic)
      return level + 1, select(settled, cands, now), settled | ok, log_z, statistic

    shapes = jax.eval_shape(self.first)
    blank = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    start = (jnp.int32(0), blank[0], blank[1], jnp.zeros(self.size, jnp.float32), unknown)
    _, cands, settled, _, _ = lax.while_loop(more, level_up, start)
    return cands, settled


def cut_width(budget: int, touched: jax.Array, vocab: int) -> int:
  """How many of the best raw tokens the cut takes: ``K`` and up to ``K`` more for the touched ids."""
  return min(vocab, budget + min(touched.shape[1], budget))


def touched_ids(stages: tuple[Stage, ...], rows: RowInputs, vocab: int, strategy: Strategy) -> jax.Array:
  """``[B, E]`` the ids the stages before the cut may change (``-1``: none)."""
  return _touched(tuple(stage for stage in stages if stage.touches is not None), rows, vocab, strategy)


def from_best(
  stages, budget: int, vocab: int, rows: RowInputs, strategy: Strategy, best, source, log_normalisers, statistic
) -> CandidatePath:
  """:func:`candidates` from the cut's raw best, wherever they came from (one device, or merged shards).

  Args:
    best: ``(logits [B, n], ids [B, n], touched [B, E])``: the ``n`` best
      cleaned tokens of each row in sampling order (``n`` from
      :func:`cut_width`) and the touched ids.
    source: ``(a, b, read)``: ``read(a[i], b[i], ids)`` gives row ``i``'s
      cleaned logits at the best and the touched ids (``-inf`` outside ``[0, V)``).
    log_normalisers: ``() -> [B]``, each cleaned row's ``log Σ exp``.
    statistic: ``() -> [B]`` the row statistic (:func:`row_statistic`), or
      None where none can be had: rows that need it are then not decided.
  """
  logits, ids, touched = best
  a, b, read = source
  top = logits[:, 0]
  touchers = tuple(stage for stage in stages if stage.touches is not None)
  extra = min(touched.shape[1], budget)
  cut_and_edit = jax.vmap(functools.partial(_cut_row, touchers, budget, extra, vocab, strategy, read))
  cut_rows = lambda *args: cut_and_edit(*args)[0]  # noqa: E731
  if touchers and not strategy.branch_free and all(stage.lowers is not None for stage in touchers):
    # Where every row only lowers, the raw best alone are exact: skip reading the touched ids.
    narrow = jnp.all(_lowers(touchers, rows, vocab, strategy))
    cut_rows = functools.partial(_narrow_or_wide, narrow, cut_rows)
  skip = _skipped(stages, rows, strategy)
  before = [
    neutral for neutral, stage in zip(skip, stages, strict=True) if stage.touches is not None and neutral is not None
  ]
  if touchers and len(before) == len(touchers):
    # Every stage before the cut neutral in every row: the raw best are the candidates.
    idle = jnp.all(jnp.stack(before))
    cut_rows = functools.partial(_unless_idle, idle, budget, vocab, cut_rows)
  # The stages before the cut run once, as if the log-normaliser were known: they only clear log_z_known
  # (Stage.touches), so each run puts in what it knows.
  known = jnp.ones(top.shape, bool)
  args = (a, b, logits, ids, touched, rows, jnp.zeros(top.shape, jnp.float32), known)
  # The accelerator's cut holds every touched id (no shortcut above), so its full path can start from the edit.
  cut_once, edit = cut_and_edit(*args) if strategy.branch_free else (cut_rows(*args), None)

  def run(log_z, log_z_known, statistic) -> tuple[Candidates, jax.Array]:
    c = cut_once._replace(log_z=log_z, log_z_known=cut_once.log_z_known & log_z_known)
    c = jax.vmap(functools.partial(_chain_row, stages, vocab, strategy, skip))(c, rows, statistic)
    return c, c.decided & c.covers_row

  has_statistic = statistic is not None and statistic_stage(stages) is not None
  return CandidatePath(run, log_normalisers, statistic if has_statistic else None, top.shape[0], edit)


def _read_row(raw: jax.Array, mask, ids: jax.Array) -> jax.Array:
  return cut.at(raw, ids, mask)


def greedy(stages: tuple[Stage, ...], rows: RowInputs, vocab: int, strategy: Strategy) -> jax.Array | None:
  """``[B]`` the rows whose token is the best of the cleaned row, or None where no stage can say so.

  That is a row where one stage keeps only its best token
  (:attr:`Stage.only_best`: temperature 0), every stage after the cut is
  argmax-invariant (:attr:`Stage.argmax_invariant`: it keeps the best token
  and lifts none above it), and the stages before the cut touch no id: the
  rows a greedy shortcut applies to.
  """
  after = tuple(stage for stage in stages if stage.touches is None)
  if not any(stage.only_best for stage in after) or not all(stage.argmax_invariant for stage in after):
    return None
  touchers = tuple(stage for stage in stages if stage.touches is not None)
  touched = _touched(touchers, rows, vocab, strategy)

  def one(row):
    said = [stage.only_best(row.settings) for stage in after if stage.only_best is not None]
    kept = [stage.argmax_invariant(row.settings) for stage in after if stage.argmax_invariant is not None]
    return jnp.any(jnp.stack(said)) & jnp.all(jnp.stack(kept))

  return jax.vmap(one)(rows) & jnp.all((touched < 0) | (touched >= vocab), axis=1)


def best(raw: jax.Array, mask, strategy: Strategy, budget: int) -> Candidates:
  """The best token of each cleaned row, as candidates ``[B, K]`` (the chain's shape, ``K`` from ``budget``)
  with the others empty: the cut's first pass and no more."""
  logits, ids = cut.top_candidates(raw, mask, 1, branch_free=strategy.branch_free)
  vocab = raw.shape[-1]
  empty = min(budget, vocab) - 1  # empty candidates: -inf at id V, which every reader drops
  logits = jnp.pad(logits, ((0, 0), (0, empty)), constant_values=-jnp.inf)
  ids = jnp.pad(ids, ((0, 0), (0, empty)), constant_values=vocab)
  unknown = jnp.zeros(logits.shape[:1], jnp.float32)
  return Candidates(ids, logits, unknown, unknown > 0, unknown == 0, unknown == 0)


def row_statistic(stages, raw, mask, rows: RowInputs, strategy: Strategy) -> jax.Array:
  """The row statistic ``[B]`` of the first stage that declares one, over the cleaned rows."""
  index = statistic_stage(stages)
  assert index is not None
  stage = stages[index]
  vocab = raw.shape[-1]

  def one(r, m, row):
    x = cut.clean_row(r, m, branch_free=strategy.branch_free)
    return jnp.asarray(stage.row_statistic(x, row.settings, context(stage, row, vocab, strategy)), jnp.float32)

  if strategy.branch_free or not raw.shape[0]:
    return jax.vmap(one)(raw, mask, rows)
  # Row by row on a CPU, so that a statistic a row does not need (its own
  # lax.cond says so) costs it nothing; rows are indexed, not mapped over.
  return jax.lax.map(lambda i: one(*jax.tree.map(lambda a: a[i], (raw, mask, rows))), jnp.arange(raw.shape[0]))


def _touched(touchers, rows: RowInputs, vocab: int, strategy: Strategy) -> jax.Array:
  """``[B, E]`` the ids the stages before the cut may change (``-1``: none)."""
  if not touchers:
    return jnp.zeros(rows.position.shape + (0,), jnp.int32)

  def one(row):
    parts = [stage.touches(row.settings, context(stage, row, vocab, strategy)) for stage in touchers]
    return jnp.concatenate([jnp.asarray(p, jnp.int32).reshape(-1) for p in parts])

  return jax.vmap(one)(rows)


def _lowers(touchers, rows: RowInputs, vocab: int, strategy: Strategy) -> jax.Array:
  """``[B]`` whether every stage before the cut only lowers the logits it touches, row by row."""

  def one(row):
    said = [stage.lowers(row.settings, context(stage, row, vocab, strategy)) for stage in touchers]
    return jnp.all(jnp.stack([jnp.asarray(s, bool) for s in said]))

  return jax.vmap(one)(rows)


def _skipped(stages: tuple[Stage, ...], rows: RowInputs, strategy: Strategy) -> list[jax.Array | None]:
  """Per stage, whether every row has it neutral (:attr:`Stage.is_neutral`), a scalar the CPU strategy branches
  on; None where it never skips the stage (no ``is_neutral``, or the accelerator strategy, which does not branch)."""
  if strategy.branch_free:
    return [None] * len(stages)
  return [
    None if stage.is_neutral is None else jnp.all(jax.vmap(lambda row, st=stage: st.is_neutral(row.settings))(rows))
    for stage in stages
  ]


def _unless_idle(idle, budget: int, vocab: int, cut_rows, raw, mask, logits, ids, touched, rows, log_z, known):
  """The cut, or where ``idle`` (no stage before it acts) the ``K`` best raw tokens as they are (one ``lax.cond``)."""

  def raw_best():
    kept = min(budget, ids.shape[1])
    whole = (kept == vocab) | (logits[:, kept - 1] == -jnp.inf)
    yes = jnp.ones(whole.shape, bool)
    return Candidates(ids[:, :kept], logits[:, :kept], log_z, known, whole, yes)

  return jax.lax.cond(idle, raw_best, lambda: cut_rows(raw, mask, logits, ids, touched, rows, log_z, known))


def _narrow_or_wide(narrow, cut_rows, raw, mask, logits, ids, touched, rows, log_z, known):
  """The cut without the touched ids where ``narrow``, else with them (one ``lax.cond``)."""
  args = (raw, mask, logits, ids)
  return jax.lax.cond(
    narrow,
    lambda: cut_rows(*args, touched[:, :0], rows, log_z, known),
    lambda: cut_rows(*args, touched, rows, log_z, known),
  )


def _cut_row(
  touchers,
  budget: int,
  extra: int,
  vocab: int,
  strategy,
  read,
  raw,
  mask,
  logits,
  ids,
  touched,
  row: RowInputs,
  log_z,
  known,
):
  """The ``K`` best tokens of one row after the stages that act before the cut, and the row they make as a
  :class:`RowEdit` (None without such stages).

  ``logits, ids`` are the row's ``K + m`` best raw tokens, ``m = min(E, K)``.
  Those stages change only their touched ids, so the ``K`` best of the changed
  row are among the touched ids and the raw best as long as at most ``m`` of
  the raw best changed (then ``K`` unchanged ones beat every token beyond
  them), or when a stage leaves no untouched token alive (it says so with
  ``covers_row``: allowed ids). A stage that only lowers logits cannot lift a
  token from beyond the raw best, so its touched ids may be left out
  (``touched`` of width 0).
  """
  (wide,) = ids.shape
  whole = (wide == vocab) | (logits[-1] == -jnp.inf)  # nothing survives beyond the cut
  c = Candidates(ids, logits, log_z, known, whole, jnp.bool_(True))
  if not touchers:
    return c, None
  # The raw best and the touched ids in one list in id order, each id once
  # (repeats stay empty: id V). A key of id and origin makes it a sort of one
  # operand: on a CPU a sort that carries a second array is several times slower.
  touched = jnp.where((touched >= 0) & (touched < vocab), touched, vocab).astype(jnp.uint32)
  keys = jnp.sort(jnp.concatenate([ids.astype(jnp.uint32) * 2, touched * 2 + 1]))
  merged = (keys >> 1).astype(jnp.int32)
  empty = jnp.concatenate([jnp.zeros(1, bool), merged[1:] == merged[:-1]]) | (merged == vocab)
  merged = jnp.where(empty, vocab, merged)
  before = jnp.where(empty, -jnp.inf, read(raw, mask, merged))
  c = c._replace(ids=merged, logits=before)
  for stage in touchers:
    c = stage.on_candidates(c, row.settings, context(stage, row, vocab, strategy))
  edit = RowEdit(c.ids, c.logits, c.covers_row)
  changed = jnp.sum(((keys & 1) == 0) & (c.logits != before))  # among the raw best
  # top_k keeps ties in list order, which is id order: sampling order without a sort.
  kept = min(budget, wide)  # beyond a whole row's V there are only empties
  best, where = jax.lax.top_k(c.logits, kept)
  kept_ids = jnp.take(c.ids, where, mode="clip")  # in bounds: clamping costs no check
  # The last kept logit as the minimum, not best[-1]: slicing top_k's values makes XLA's CPU backend
  # trade its TopK kernel for a full sort (over twice as slow).
  last = jnp.min(best)
  # Covers the row: no token beyond the kept ones survives. Those beyond the list
  # hold none when the row was whole or a stage removed every untouched token.
  kept_row = c._replace(
    ids=kept_ids,
    logits=best,
    covers_row=c.covers_row & ((whole & (kept == wide)) | (last == -jnp.inf)),
    decided=c.decided & (c.covers_row | (changed <= extra) | _ahead(last, kept_ids[-1], logits[-1], ids[-1])),
  )
  return kept_row, edit


def _ahead(logit, token, last, last_id) -> jax.Array:
  """Whether ``(logit, token)`` ranks before the last raw candidate ``(last, last_id)``: then
  every token beyond the cut, untouched or only lowered, ranks after the ``K`` kept."""
  return (logit > last) | ((logit == last) & (token <= last_id))


def _chain_row(stages, vocab: int, strategy: Strategy, skip, c: Candidates, row: RowInputs, statistic) -> Candidates:
  """The ``O(K)`` rest of the candidate path for one row: the stages after the cut, but those ``skip``
  (unbatched) says every row has neutral. The first stage that declares a row statistic gets ``statistic``."""
  index = statistic_stage(stages)
  unknown = jnp.float32(jnp.nan)
  for i, stage in enumerate(stages):
    if stage.touches is None:
      ctx = context(stage, row, vocab, strategy, statistic if i == index else unknown)
      apply = functools.partial(lambda c, stage, ctx: stage.on_candidates(c, row.settings, ctx), stage=stage, ctx=ctx)
      c = apply(c) if skip[i] is None else jax.lax.cond(skip[i], lambda c: c, apply, c)
  return c


def full_path(
  stages: tuple[Stage, ...], raw: jax.Array, mask, row: RowInputs, strategy: Strategy, edit: RowEdit | None = None
) -> jax.Array:
  """The full-vocabulary path for one row: every stage on ``[V]``, no sort.

  With the cut's ``edit`` (:attr:`CandidatePath.edit`), the stages before the cut are not run again: their
  result is the cleaned row with the edit written in, one scatter of ``n`` values instead of their passes.
  """
  cleaned = cut.clean_row(raw, mask, branch_free=strategy.branch_free)
  if edit is None:
    return on_row(stages, cleaned, row, strategy)
  rest = jnp.where(edit.rest_removed, -jnp.inf, cleaned)
  edited = rest.at[edit.ids].set(edit.logits, mode="drop")
  return on_row(tuple(stage for stage in stages if stage.touches is None), edited, row, strategy)


def on_row(stages: tuple[Stage, ...], cleaned: jax.Array, row: RowInputs, strategy: Strategy) -> jax.Array:
  """Every stage's ``on_row`` on one cleaned row ``[V]``, in order."""
  x = cleaned
  for stage in stages:
    x = stage.on_row(x, row.settings, context(stage, row, x.shape[0], strategy))
  return x
