"""Sampling from logits sharded over the vocabulary (and the batch) of a :class:`jax.sharding.Mesh`.

Each device holds a slice ``[b, V / n]`` of the logits. Inside one
``shard_map`` every vocabulary shard cleans and masks the ids it owns, takes
its own best ``n`` tokens (with global ids; ``n`` the cut's width, :func:`paths.cut_width`),
and reads the logits of the touched ids it owns (penalties, bias). Only small
arrays cross devices: an all-gather of the candidates (``[b, n × shards]``,
never the row) and a ``pmax`` of the touched ids' logits ``[b, E]``. Where
some row needs its log-normaliser (top-k off under top-p, say), a second pass
reduces each shard's ``log Σ exp`` and combines them by ``pmax``/``psum``
(``[b]``), behind one ``lax.cond``, as the single-device path does.
The merge is exact: the ``n`` best of a row are among the ``n`` best of each
shard, and shards gathered in id order keep ``top_k``'s ties on the lower id.

From there the ordinary candidate path runs (:func:`paths.from_best`: the
stages before the cut on the touched ids, the chain, the id-keyed race), so a
row's token is the one :meth:`Sampler.pick` draws on one device.

Rows the candidates cannot decide (a nucleus or a min-p cut beyond them, or a
row statistic such as eta's entropy, which needs the whole row) take the
full-vocabulary path behind a second ``lax.cond``: every stage's ``on_row`` on
the sharded ``[B, V]`` logits, branch-free, which XLA partitions so that each
reduction over ``V`` is a per-shard partial and an all-reduce of ``[B]``
values. The row itself never crosses devices.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jsample._src import draw, paths, run
from jsample._src.kernels import cut, masks
from jsample._src.kernels import strategy as strategies
from jsample._src.state import SamplerState


def sharded(
  sampler, mesh: Mesh, vocab_axis: str = "v", batch_axis: str | None = None
) -> Callable[..., tuple[jax.Array, SamplerState]]:
  """``sampler.pick`` for logits sharded over ``mesh``: ``(logits, state, mask=None, **inputs) -> (token, state)``.

  The logits' vocabulary axis is split over the mesh axis ``vocab_axis``,
  their batch axis over ``batch_axis`` (None: every device holds every row).
  Only candidates cross devices, ``O(K × shards)`` per row. The function
  works under :func:`jax.jit`; logits placed otherwise are resharded to this
  layout by XLA.

  Every row's token and new state equal :meth:`Sampler.pick`'s on one
  device, up to the order in which floating-point sums are added (per shard,
  then across shards): a nucleus whose mass lies within a rounding error of
  ``top_p`` could end one token apart. Rows the candidates decide cost an
  all-gather of ``O(K × shards)`` candidates; the others (top-k off with a
  nucleus beyond ``K`` candidates on a flat row, say) take the full path on
  their shards, whose collectives move ``[B]`` values per search step.

  Args:
    sampler: a :class:`Sampler`.
    mesh: the devices.
    vocab_axis: the mesh axis the vocabulary is split over; ``V`` must divide
      evenly (a packed mask is unpacked unless each shard's ``V / n`` is a
      multiple of 32).
    batch_axis: optional mesh axis the rows are split over; ``B`` must divide
      evenly.

  Returns:
    ``pick(logits, state, mask=None, **inputs) -> (token, state)`` with
    :meth:`Sampler.pick`'s arguments; ``token`` is ``[]`` or ``[B]`` int32.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np, jsample
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("v",))
    >>> sampler = jsample.llama_cpp()
    >>> pick = jax.jit(jsample.sharded(sampler, mesh, vocab_axis="v"))
    >>> logits = jnp.log(jnp.array([[0.1, 0.6, 0.3, 0.0]]))
    >>> state = sampler.init(seed=[3])
    >>> pick(logits, state)[0].tolist() == sampler.pick(logits, state)[0].tolist()
    True
  """
  if vocab_axis not in mesh.shape:
    raise ValueError(f"vocab_axis: {vocab_axis!r} is not an axis of the mesh {dict(mesh.shape)}")
  if batch_axis is not None and batch_axis not in mesh.shape:
    raise ValueError(f"batch_axis: {batch_axis!r} is not an axis of the mesh {dict(mesh.shape)}")
  if batch_axis == vocab_axis:
    raise ValueError("batch_axis: must differ from vocab_axis")

  def pick(logits, state: SamplerState, mask=None, **inputs) -> tuple[jax.Array, SamplerState]:
    (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, dict(inputs, mask=mask))
    batch, vocab = raw.shape
    shards = mesh.shape[vocab_axis]
    rows_axis = None if single else batch_axis
    if vocab % shards:
      raise ValueError(f"logits: V={vocab} does not split evenly over the {shards} devices of {vocab_axis!r}")
    if rows_axis is not None and batch % mesh.shape[rows_axis]:
      raise ValueError(
        f"logits: B={batch} does not split evenly over the {mesh.shape[rows_axis]} devices of {rows_axis!r}"
      )
    if mask is not None and mask.dtype != jnp.bool_ and (vocab // shards) % 32:
      mask = masks.unpack(mask, vocab)  # packed words would straddle shards
    touched = paths.touched_ids(sampler.stages, rows, vocab, strategy)
    width = paths.cut_width(sampler.budget, touched, vocab)
    best, touched_logits, tops = _shard_cut(mesh, vocab_axis, rows_axis, width, strategy, raw, mask, touched)
    before = jax.tree.map(lambda a: a[None], state) if single else state
    by_row = functools.partial(jax.tree.map, lambda _: P(rows_axis))

    def per_row(f, *args):  # O(K) per row: each batch shard runs it for its own rows
      out = jax.eval_shape(f, *args)
      return jax.shard_map(f, mesh=mesh, in_specs=by_row(args), out_specs=by_row(out), check_vma=False)(*args)

    known = (best, touched, touched_logits, rows)
    candidates = functools.partial(_candidates, sampler, vocab, strategy)
    first, ok = per_row(lambda b, t, tl, r: candidates(b, t, tl, r, None), *known)
    race = functools.partial(per_row, lambda c, step_bits: jax.vmap(draw.on_candidates)(c.logits, c.ids, step_bits))
    whole = NamedSharding(mesh, P(rows_axis, vocab_axis))
    # A stage that updates its state (mirostat) needs the drawn token's log-probability.
    logprob = any(stage.update is not None for stage in sampler.stages)

    def rare():  # the log-normalisers, a pass over every shard, only where some row needs them
      log_z = _shard_log_z(mesh, vocab_axis, rows_axis, strategy, raw, mask, tops)
      refined, better = per_row(candidates, *known, log_z)
      drawn, settled = race(strategies.select(ok, first, refined), rows.step_bits), ok | better

      def full():  # the rows the candidates still cannot decide, on the whole sharded row
        return strategies.select(settled, drawn, _full_path(sampler, whole, raw, mask, rows, logprob))

      return lax.cond(jnp.all(settled), lambda: drawn, full)

    drawn = lax.cond(jnp.all(ok), lambda: race(first, rows.step_bits), rare)
    after = per_row(lambda s, d, i: run.advance(sampler, s, d, i, vocab), before, drawn, rows.inputs)
    if single:
      return drawn.token[0], jax.tree.map(lambda a: a[0], after)
    return drawn.token, after

  return pick


def _candidates(sampler, vocab: int, strategy, best, touched, touched_logits, rows, log_z):
  """The candidate path on the merged candidates: ``(candidates, settled)``; without ``log_z`` (None), the
  first run, else the run with the row's log-normalisers."""
  path = paths.from_best(
    sampler.stages,
    sampler.budget,
    vocab,
    rows,
    strategy,
    best + (touched,),
    (jnp.concatenate([best[1], touched], 1), jnp.concatenate([best[0], touched_logits], 1), _read_known),
    lambda: log_z,
    None,
  )
  if log_z is None:
    return path.first()
  return path.run(log_z, jnp.ones(log_z.shape, bool), jnp.full(log_z.shape, jnp.nan, jnp.float32))


def _full_path(sampler, whole: NamedSharding, raw, mask, rows: paths.RowInputs, logprob: bool) -> draw.Draw:
  """Every row's draw on its full row, with the logits left sharded as ``whole``: the stages' own ``on_row``
  under the accelerator strategy (branch-free and batched), which XLA partitions over the shards. Each
  reduction over ``V`` (a search step's mass, the race's best score) becomes per-shard partials and an
  all-reduce of ``[B]`` values; nothing indexes the row, so no shard gathers another's logits."""
  strategy = strategies.ACCELERATOR
  x = lax.with_sharding_constraint(cut.clean(raw), whole)
  if mask is not None:  # unpacked by broadcasting, each shard its own words
    allowed = mask if mask.dtype == jnp.bool_ else masks.unpack(mask, raw.shape[-1])
    x = jnp.where(lax.with_sharding_constraint(allowed, whole), x, -jnp.inf)

  def one(x, row):
    final = paths.on_row(sampler.stages, x, row, strategy)
    return draw.on_row(final, row.step_bits, strategy.race_row, logprob=logprob)

  return jax.vmap(one)(x, rows)


def _shard_cut(mesh, vocab_axis: str, rows_axis, width: int, strategy, raw, mask, touched):
  """The best ``width`` tokens of each row and the touched ids' logits, merged over the shards; and each
  shard's best logit ``[B, shards]``."""
  row_spec, small = P(rows_axis, vocab_axis), P(rows_axis, None)
  local = functools.partial(_local_cut, vocab_axis, width, strategy.branch_free)
  args: tuple = (raw, touched) if mask is None else (raw, mask, touched)
  specs: tuple = (row_spec, small) if mask is None else (row_spec, row_spec, small)

  def body(*args):
    return local(args[0], None, args[1]) if mask is None else local(*args)

  out_specs = ((small, small), small, row_spec)
  # The outputs are alike on every vocabulary shard (they follow all-gathers and pmax):
  # JAX cannot infer that through top_k.
  return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(*args)


def _local_cut(vocab_axis: str, width: int, branch_free: bool, raw, mask, touched):
  """One shard's part of the cut; its results are the same on every shard of a row (after the collectives)."""
  part = raw.shape[1]
  offset = lax.axis_index(vocab_axis).astype(jnp.int32) * part
  logits, ids = cut.top_candidates(raw, mask, min(width, part), branch_free=branch_free)
  # The touched ids this shard owns read their cleaned logit; the others -inf; the owner's wins the pmax.
  local = touched - offset
  local = jnp.where((local >= 0) & (local < part), local, -1)
  touched_logits = lax.pmax(jax.vmap(cut.at)(raw, local, mask), vocab_axis)
  top = logits[:, :1]  # this shard's best, for its log-normaliser
  # Gathered in shard order, which is id order: top_k's ties go to the lower id, as on one device.
  logits = lax.all_gather(logits, vocab_axis, axis=1, tiled=True)
  ids = lax.all_gather(ids + offset, vocab_axis, axis=1, tiled=True)
  logits, where = lax.top_k(logits, width)
  return (logits, jnp.take_along_axis(ids, where, axis=1)), touched_logits, top


def _shard_log_z(mesh, vocab_axis: str, rows_axis, strategy, raw, mask, tops):
  """``log Σ exp`` of each cleaned row ``[B]``: each shard's own (given its best, ``tops``), combined."""

  def body(raw, mask, top):
    log_z = cut.log_normalisers(raw, mask, top[:, 0], branch_free=strategy.branch_free)
    big = lax.pmax(log_z, vocab_axis)
    shift = jnp.where(big > -jnp.inf, big, 0.0)
    return shift + jnp.log(lax.psum(jnp.exp(log_z - shift), vocab_axis))

  row_spec = P(rows_axis, vocab_axis)
  if mask is None:
    return jax.shard_map(
      lambda r, t: body(r, None, t), mesh=mesh, in_specs=(row_spec, row_spec), out_specs=P(rows_axis), check_vma=False
    )(raw, tops)
  return jax.shard_map(
    body, mesh=mesh, in_specs=(row_spec, row_spec, row_spec), out_specs=P(rows_axis), check_vma=False
  )(raw, mask, tops)


def _read_known(ids: jax.Array, logits: jax.Array, at: jax.Array) -> jax.Array:
  """The logits at token ids ``at``, looked up among the known ``(ids, logits)`` of one row; ``-inf`` if unknown."""
  same = (at[:, None] == ids[None, :]) & (ids[None, :] >= 0)
  return jnp.max(jnp.where(same, logits[None, :], -jnp.inf), axis=1, initial=-jnp.inf)
