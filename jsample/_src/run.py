"""One call of a sampler: check and batch the inputs, choose each row's path, draw, advance the state.

:class:`Sampler`'s methods delegate here; every function takes the sampler
first and works on a batch of rows (one row gets a batch axis of one).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src import checked, draw, logprobs, paths, validation
from jsample._src.draw import Draw
from jsample._src.kernels import noise
from jsample._src.kernels import strategy as strategies
from jsample._src.state import SamplerState, append


def one_row_or_batch(sampler, method, logits, state: SamplerState, inputs: dict, **static):
  """``method(sampler, logits, state, inputs)``; for one row ``[V]``, with a batching rule of its own.

  Under ``jax.vmap(sampler.pick)`` JAX would otherwise map the one-row
  program over the rows, and its conditionals would become selects that run
  every branch (the full-vocabulary path included) for every row. The rule
  runs the batched call instead: the same tokens, at the batched call's cost.

  Called on concrete arrays (outside ``jit``), the call is compiled once per
  sampler, method and shapes (:func:`compiled`) rather than run op by op.
  """
  if outside_jit(sampler, (logits, state, inputs)):
    return compiled_call(sampler, _one_row_or_batch, logits, state, inputs, method, **static)
  return _one_row_or_batch(sampler, method, logits, state, inputs, **static)


def compiled_call(sampler, function, logits, state: SamplerState, inputs: dict, *static_args, **static):
  """``function(sampler, *static_args, logits, state, inputs, **static)`` on concrete arrays, compiled
  (:func:`compiled`), after the one check of values that a traced call skips: the window's ids."""
  logits = jnp.asarray(logits)
  inputs = {name: None if value is None else jnp.asarray(value) for name, value in inputs.items()}
  validation.logits(logits, sampler.vocab_size)
  validation.tokens("state.window", state.window, logits.shape[-1], lowest=-1)
  return compiled(sampler, function, *static_args, **static)(logits, state, inputs)


def _one_row_or_batch(sampler, method, logits, state: SamplerState, inputs: dict, **static):
  call = functools.partial(method, sampler, **static)
  if jnp.ndim(logits) != 1 or sampler.checking:  # checkify does not cross a custom batching rule
    return call(logits, state, inputs)
  inputs = {name: value for name, value in inputs.items() if value is not None}

  @jax.custom_batching.custom_vmap
  def one_row(logits, state, inputs):
    return call(logits, state, inputs)

  @one_row.def_vmap
  def rows(axis_size, in_batched, logits, state, inputs):
    def spread(value, batched):
      return value if batched else jnp.broadcast_to(value, (axis_size,) + jnp.shape(value))

    args = jax.tree.map(spread, (logits, state, inputs), tuple(in_batched))
    out = call(*args)
    return out, jax.tree.map(lambda _: True, out)

  return one_row(logits, state, inputs)


def compiled(sampler, function, *static_args, **static):
  """``jax.jit`` of ``function(sampler, *static_args, *arrays, **static)``, made once per sampler (kept on it),
  function and static arguments: how a sampler runs a call made outside ``jit`` (:func:`outside_jit`).

  Run op by op, a call dispatches thousands of operations, and JAX compiles each of its conditionals afresh
  on every call (their branches are new functions each time): about 5 s per call of ``llama_cpp().pick``,
  against one compile and then microseconds.
  """
  key = (function, static_args, tuple(sorted(static.items())))
  programs = sampler._programs
  if key not in programs:
    programs[key] = jax.jit(functools.partial(function, sampler, *static_args, **static))
  return programs[key]


def outside_jit(sampler, arrays) -> bool:
  """Whether a call on ``arrays`` is made outside any trace (``jit``, ``vmap``, ...), so that the sampler
  compiles it (:func:`compiled`); a checked sampler runs op by op, where its checks raise at once."""
  return sampler.checking is None and not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(arrays))


def draws(
  sampler, logits, state: SamplerState, inputs: dict, *, logprob: bool, top_logprobs: int | None = None
) -> tuple[Draw, SamplerState]:
  """The draw of every row, and the state after it; with ``top_logprobs``, also :class:`Logprobs`
  (``inputs["top_logprobs"]``, if given, is each row's own number of alternatives)."""
  (raw, mask), rows, single, strategy = prepare(sampler, logits, state, inputs)
  # pick drops the log-probability, and on a full row it costs an exp per token.
  needs_logprob = logprob or any(stage.update is not None for stage in sampler.stages)

  def fast(cands):
    return jax.vmap(draw.on_candidates)(cands.logits, cands.ids, rows.step_bits)

  def slow(raw, mask, row, edit):
    final = paths.full_path(sampler.stages, raw, mask, row, strategy, edit)
    return draw.on_row(final, row.step_bits, strategy.race_row, logprob=needs_logprob)

  batch = raw.shape[0]
  blank = Draw(jnp.zeros(batch, jnp.int32), jnp.zeros(batch, bool), jnp.zeros(batch, jnp.float32))
  drawn = route(sampler, raw, mask, rows, strategy, fast, slow, blank)
  if top_logprobs is not None:
    per_row = rows.inputs.get("top_logprobs")
    drawn = drawn._replace(raw=logprobs.of(raw, drawn.token, drawn.valid, top_logprobs, per_row, strategy))
  if sampler.checking:
    checked.drawn(sampler, drawn.valid)
  state = advance(sampler, _batched(state, single), drawn, rows.inputs, raw.shape[-1])
  if single:
    drawn, state = jax.tree.map(lambda a: a[0], (drawn, state))
  return drawn, state


def probs(sampler, logits, state: SamplerState, inputs: dict) -> jax.Array:
  """The distribution each row's draw uses, ``[B, V]``."""
  (raw, mask), rows, single, strategy = prepare(sampler, logits, state, inputs)
  vocab = raw.shape[-1]

  def spread(cands):
    return jax.vmap(lambda x, ids: jnp.zeros(vocab, jnp.float32).at[ids].set(draw.softmax(x), mode="drop"))(
      cands.logits, cands.ids
    )

  def slow(raw, mask, row, edit):
    return draw.softmax(paths.full_path(sampler.stages, raw, mask, row, strategy, edit))

  out = route(sampler, raw, mask, rows, strategy, spread, slow, jnp.zeros(raw.shape, jnp.float32))
  return out[0] if single else out


def route(sampler, raw, mask, rows: paths.RowInputs, strategy: strategies.Strategy, fast, slow, blank):
  """``fast(candidates)`` for the rows the candidates decide, ``slow(row)`` for the others.

  Each is written into the program once: the strategy chooses each row's candidates (first pass or refined) and
  runs the full path where they cannot decide, filling ``blank`` (``slow``'s batched output, zeros) elsewhere;
  the greedy shortcut's candidates are each row's best token alone; ``fast`` then runs on the chosen
  candidates, outside every branch.

  The greedy shortcut is the CPU strategy's alone: on an accelerator a conditional is a host round trip, and a
  greedy row's candidates already decide it, so the accelerator's program keeps one conditional, the rare path's.
  """

  def run_chain():
    path = paths.candidates(sampler.stages, sampler.budget, raw, mask, rows, strategy)
    return strategy.fallback(path, slow, blank, raw, mask, rows)

  def best():  # a batch of greedy rows needs the best token of each row, one pass: no cut, no search
    settled = jnp.ones(raw.shape[:1], bool)
    return paths.best(raw, mask, strategy, sampler.budget), settled, blank

  greedy = None if strategy.branch_free else paths.greedy(sampler.stages, rows, raw.shape[-1], strategy)
  if greedy is None or not raw.shape[0]:
    cands, settled, full = run_chain()
  else:
    cands, settled, full = lax.cond(jnp.all(greedy), best, run_chain)
  return strategies.select(settled, fast(cands), full)


def accept(sampler, token: jax.Array, state: SamplerState) -> SamplerState:
  """:meth:`Sampler.accept` on checked int32 tokens: each row's token in its window, its log-probability unknown."""
  if token.shape != state.position.shape:
    raise ValueError(f"token: must have shape {state.position.shape} to match the state; got {token.shape}")
  single = token.ndim == 0
  token, state = token.reshape(-1), _batched(state, single)
  drawn = Draw(token, jnp.ones(token.shape, bool), jnp.full(token.shape, jnp.nan, jnp.float32))
  state = advance(sampler, state, drawn, {}, sampler.vocab_size or 0)
  return jax.tree.map(lambda a: a[0], state) if single else state


def advance(sampler, state: SamplerState, drawn: Draw, inputs: dict, vocab: int) -> SamplerState:
  """Accepts the drawn tokens and updates the stages' own state; batched rows."""
  # A row where nothing survived still advances, with an empty window slot.
  accepted = jnp.where(drawn.valid, drawn.token, -1)
  stages = dict(state.stages)
  updating = [stage for stage in sampler.stages if stage.update is not None]
  if updating:
    step_bits = jax.vmap(noise.step_bits)(state.key, state.position)
    rows = paths.RowInputs(state.settings, state.window, state.position, step_bits, inputs, state.stages)
    strategy = strategies.resolve(sampler.strategy)

    def update(stage, row, token, logprob):
      ctx = paths.context(stage, row, vocab, strategy)
      return stage.update(ctx.state, token, logprob, row.settings, ctx)

    for stage in updating:
      stages[stage.name] = jax.vmap(lambda r, t, lp, s=stage: update(s, r, t, lp))(rows, accepted, drawn.logprob)
  window, position = jax.vmap(append)(state.window, state.position, accepted)
  return state._replace(window=window, position=position, stages=stages)


def prepare(sampler, logits, state: SamplerState, inputs: dict):
  """Checks the inputs; returns ``((raw, mask), rows, single, strategy)`` with a batch axis.

  The logits stay as given: each reader cleans what it reads (see
  :func:`cut.clean`), so no float32 copy of the batch is ever written.
  """
  logits = jnp.asarray(logits)
  validation.logits(logits, sampler.vocab_size)
  if state.position.shape != logits.shape[:-1]:
    raise ValueError(
      f"state: holds rows of shape {state.position.shape}, logits {logits.shape} need {logits.shape[:-1]}"
    )
  given = {name: jnp.asarray(value) for name, value in inputs.items() if value is not None}
  declared = sampler.inputs
  validation.inputs(given, declared, logits.shape)
  missing = sorted(set(declared) - set(given))
  if missing:
    raise ValueError(f"{missing[0]}: the stage {declared[missing[0]]!r} needs this input; pass it to the call")
  # Window ids outside the vocabulary count for no token; say so where they can be seen.
  validation.tokens("state.window", state.window, logits.shape[-1], lowest=-1)
  if sampler.checking:
    checked.inputs(sampler, logits, state)
  single = logits.ndim == 1
  if single:
    logits, given, state = jax.tree.map(lambda a: a[None], (logits, given, state))
  mask = given.pop("mask", None)
  step_bits = jax.vmap(noise.step_bits)(state.key, state.position)
  rows = paths.RowInputs(state.settings, state.window, state.position, step_bits, given, state.stages)
  return (logits, mask), rows, single, strategies.resolve(sampler.strategy)


def _batched(state: SamplerState, single: bool) -> SamplerState:
  return jax.tree.map(lambda a: a[None], state) if single else state
