"""Samplers: a chain of stages and the pure functions that run it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src import checked, draw, noise, paths, validation
from jsample._src import strategy as strategies
from jsample._src.draw import Draw
from jsample._src.stage import Setting, Stage
from jsample._src.state import SamplerState, append, as_prompt, load


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
  """

  name: str
  survivors: jax.Array
  entropy: jax.Array
  ids: jax.Array
  probs: jax.Array


@dataclasses.dataclass(frozen=True)
class Sampler:
  """A chain of stages and the pure functions that run it.

  Build one with :func:`chain` or a recipe (:func:`llama_cpp`, :func:`gemma`,
  :func:`hf`). Every method is a pure function of arrays and works under
  ``jit``, ``vmap`` and inside ``lax.scan``/``lax.while_loop``.

  Attributes:
    stages: the stages, in the order they act.
    window_size: ``W``, the ring buffer's capacity (static).
    budget: ``K``, the candidate budget of the fast path (static). It
      changes speed only, never a token.
    vocab_size: ``V`` if known; then prompts and logits are checked against it.
    strategy: ``"auto"``, ``"cpu"`` or ``"accelerator"`` (see
      :mod:`jsample._src.strategy`); the tokens are the same.
    checking: what :meth:`checked` turned on; None for an unchecked sampler.
  """

  stages: tuple[Stage, ...]
  window_size: int = 64
  budget: int = 128
  vocab_size: int | None = None
  strategy: str = "auto"
  checking: checked.Checks | None = None

  def __post_init__(self):
    for name, value, least in (("window_size", self.window_size, 0), ("budget", self.budget, 1)):
      if value < least:
        raise ValueError(f"{name}: must be >= {least}; got {value}")
    if self.vocab_size is not None and self.vocab_size < 1:
      raise ValueError(f"vocab_size: must be >= 1; got {self.vocab_size}")
    if self.strategy not in strategies.NAMES:
      raise ValueError(f"strategy: must be one of {strategies.NAMES}; got {self.strategy!r}")
    names = [s.name for stage in self.stages for s in stage.settings]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
      raise ValueError(f"stages: each setting may belong to one stage only; repeated: {repeated}")
    stateful = [stage.name for stage in self.stages if stage.init_state is not None]
    if len(set(stateful)) < len(stateful):
      raise ValueError(f"stages: stages that keep state need distinct names; got {stateful}")
    for setting in self.settings.values():
      self._check(setting, setting.default)
    first = next((i for i, stage in enumerate(self.stages) if stage.touches is None), len(self.stages))
    late = [stage.name for stage in self.stages[first:] if stage.touches is not None]
    if late:
      raise ValueError(
        f"stages: {late} act on the full row before the cut to candidates, so they must come before "
        f"every other stage; got the order {[stage.name for stage in self.stages]}"
      )

  def _check(self, setting: Setting, value) -> None:
    validation.setting(setting, value, {"window_size": self.window_size, "budget": self.budget})

  @property
  def settings(self) -> dict[str, Setting]:
    """Every setting of the chain, by name."""
    return {s.name: s for stage in self.stages for s in stage.settings}

  @property
  def inputs(self) -> dict[str, str]:
    """The per-call inputs the stages read besides ``mask``: name -> stage."""
    return {name: stage.name for stage in self.stages for name in stage.inputs}

  def checked(self, *, nan: bool = True, empty: bool = True) -> "Sampler":
    """This sampler, reporting as errors the bad values ``jit`` lets through.

    Under ``jit`` nothing can raise on a traced value, so by default a bad one
    gets a defined result (a repeat penalty of 0 turns penalties off, NaN counts
    as ``-inf``, an empty row comes back with ``valid=False``). A checked
    sampler states each such problem with :func:`jax.experimental.checkify.check`
    instead: settings outside the ranges ``init`` enforces, window or prompt ids
    outside ``[-1, V)``, accepted tokens outside ``[0, V)``, and optionally NaN
    logits and rows where no token survives. Outside ``jit`` it raises at once;
    under ``jit``, wrap the program in ``checkify.checkify`` and call
    ``err.throw()`` on its result. The checks cost a few reductions per step.

    Args:
      nan: also report a NaN logit.
      empty: also report a row where nothing survives.

    Returns:
      A :class:`Sampler` that draws the same tokens.

    Examples:
      >>> import jax, jax.numpy as jnp, jsample
      >>> from jax.experimental import checkify
      >>> sampler = jsample.llama_cpp().checked()
      >>> @jax.jit
      ... @checkify.checkify
      ... def step(logits, state, top_p):
      ...   state = sampler.configure(state, top_p=top_p)  # traced: no ValueError possible
      ...   return sampler.pick(logits, state)
      >>> err, (token, state) = step(jnp.zeros((2, 8)), sampler.init(seed=[1, 2]), jnp.array([0.9, 0.0]))
      >>> print(err.get())  # err.throw() raises it  # doctest: +ELLIPSIS
      top_p: must be in (0, 1]; row 1 holds 0.0 ...
    """
    return dataclasses.replace(self, checking=checked.Checks(nan=nan, empty=empty))

  # -- state ------------------------------------------------------------------

  def init(self, seed=None, prompt=None, *, key=None, batch: int | None = None, **settings) -> SamplerState:
    """A fresh state: one row, or a batch when any argument has a batch axis.

    Args:
      seed: int or ``[B]`` ints; each row's stream. Defaults to 0.
      prompt: optional ``[L]``, ``[B, L]`` (padded with ``-1``) or a list of
        lists of token ids, loaded into the window as by :meth:`load_prompt`.
      key: typed PRNG keys ``[]`` or ``[B]``, instead of ``seed``.
      batch: ``B``, when no other argument says it.
      **settings: values for the chain's settings (``temperature=0.7``,
        ``top_p=[0.9, 1.0]``), each a scalar or one value per row (vector
        settings: ``[N]`` or ``[B, N]``).

    Returns:
      A :class:`SamplerState`.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp()
      >>> state = sampler.init(seed=[1, 2], temperature=[0.0, 0.8])
      >>> state.position.shape
      (2,)
    """
    known = self.settings
    unknown = sorted(set(settings) - set(known))
    if unknown:
      raise ValueError(f"{unknown[0]}: not a setting of this sampler; its settings are {sorted(known)}")
    if seed is not None and key is not None:
      raise ValueError("seed, key: give one of them, not both")
    for name, value in settings.items():
      self._check(known[name], value)
    if key is not None and not jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
      raise ValueError(
        "key: must be typed PRNG keys from jax.random.key (or jax.random.wrap_key_data); "
        f"got dtype {jnp.asarray(key).dtype}"
      )
    if seed is not None and validation.is_concrete(seed):
      seeds = np.asarray(seed)
      if not np.issubdtype(seeds.dtype, np.integer) or np.any(seeds < 0) or np.any(seeds >= 2**32):
        raise ValueError(f"seed: must be integers in [0, 2**32); got {seed!r}")
    if prompt is not None:
      prompt = as_prompt(prompt)

    shapes = {name: validation.rows_of(known[name], v) for name, v in settings.items()}
    for name, value in (("seed", seed), ("key", key)):
      if value is not None:
        shapes[name] = np.shape(value)
        if len(shapes[name]) > 1:
          raise ValueError(f"{name}: must be a scalar or one value per row [B]; got shape {shapes[name]}")
    if prompt is not None and prompt.ndim == 2:
      shapes["prompt"] = prompt.shape[:1]
    sizes = {name: shape[0] for name, shape in shapes.items() if shape}
    if batch is not None:
      sizes["batch"] = batch
    if len(set(sizes.values())) > 1:
      raise ValueError(f"batch sizes disagree: {sizes}")
    rows = () if not sizes else (next(iter(sizes.values())),)

    if key is None:
      per_row = jnp.broadcast_to(jnp.asarray(0 if seed is None else seed, jnp.uint32), rows)
      key = jax.vmap(jax.random.key)(per_row.reshape(-1)).reshape(rows)
    else:
      key = jnp.broadcast_to(key, rows)
    values = {
      name: jnp.broadcast_to(jnp.asarray(settings.get(name, s.default), s.dtype), rows + s.shape)
      for name, s in known.items()
    }
    own = {
      stage.name: jax.tree.map(lambda a: jnp.broadcast_to(a, rows + jnp.shape(a)), stage.init_state())
      for stage in self.stages
      if stage.init_state is not None
    }
    fresh = SamplerState(
      key=key,
      position=jnp.zeros(rows, jnp.int32),
      window=jnp.full(rows + (self.window_size,), -1, jnp.int32),
      settings=values,
      stages=own,
    )
    return fresh if prompt is None else self.load_prompt(fresh, prompt)

  def configure(self, state: SamplerState, **settings) -> SamplerState:
    """Returns ``state`` with new setting values; nothing recompiles.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp()
      >>> state = sampler.configure(sampler.init(seed=0), temperature=0.0)
      >>> float(state.settings["temperature"])
      0.0
    """
    rows = state.position.shape
    for name, value in settings.items():
      spec = self.settings.get(name)
      if spec is not None and np.ndim(value) > len(rows) + len(spec.shape):
        raise ValueError(f"{name}: the state holds one row, so give a scalar; got shape {np.shape(value)}")
    fresh = self.init(key=state.key, **settings)
    updated = {name: jnp.broadcast_to(fresh.settings[name], state.settings[name].shape) for name in settings}
    return state._replace(settings={**state.settings, **updated})

  def load_prompt(self, state: SamplerState, prompt) -> SamplerState:
    """Loads prompt tokens into the window, as llama-server does before its first draw.

    Args:
      state: the rows' state.
      prompt: ``[L]`` token ids for one row (or for every row of a batch),
        ``[B, L]`` padded with ``-1``, or a list of lists.

    Returns:
      ``state`` with the last ``W`` prompt tokens in the window and
      ``position`` advanced by the prompt's length.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp(window_size=4)
      >>> state = sampler.load_prompt(sampler.init(seed=0), [5, 6, 7, 8, 9])
      >>> state.window.tolist(), int(state.position)
      ([9, 6, 7, 8], 5)
    """
    prompt = as_prompt(prompt)
    validation.tokens("prompt", prompt, self.vocab_size, lowest=-1)
    if self.checking:
      checked.tokens("prompt", prompt, self.vocab_size, lowest=-1)
    batched = state.position.ndim == 1
    if prompt.ndim == 2 and not batched:
      raise ValueError(f"prompt: a [B, L] prompt needs a batched state; got shape {prompt.shape}")
    prompt = jnp.asarray(prompt, jnp.int32)
    if batched:
      prompt = jnp.broadcast_to(prompt, state.position.shape + prompt.shape[-1:])
      window, position = jax.vmap(load)(state.window, state.position, prompt)
    else:
      window, position = load(state.window, state.position, prompt)
    return state._replace(window=window, position=position)

  def accept(self, state: SamplerState, token: jax.Array) -> SamplerState:
    """Appends tokens chosen by the caller (speculative decoding, forced tokens).

    Stages that keep state update it as after a draw, with the token's
    log-probability unknown (NaN).

    Args:
      state: the rows' state.
      token: ``[]`` or ``[B]`` int32, matching the state.

    Returns:
      ``state`` with ``token`` in the window and ``position + 1``.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp(window_size=4)
      >>> state = sampler.accept(sampler.init(seed=0), 7)
      >>> state.window.tolist(), int(state.position)
      ([7, -1, -1, -1], 1)
    """
    if not jnp.issubdtype(jnp.asarray(token).dtype, jnp.integer):
      raise ValueError(f"token: must be integer token ids; got dtype {jnp.asarray(token).dtype}")
    validation.tokens("token", token, self.vocab_size, lowest=0)
    if self.checking:
      checked.tokens("token", token, self.vocab_size, lowest=0)
    token = jnp.asarray(token, jnp.int32)
    if token.shape != state.position.shape:
      raise ValueError(f"token: must have shape {state.position.shape} to match the state; got {token.shape}")
    single = token.ndim == 0
    if single:
      token, state = token[None], jax.tree.map(lambda a: a[None], state)
    drawn = Draw(token, jnp.ones(token.shape, bool), jnp.full(token.shape, jnp.nan, jnp.float32))
    state = self._advance(state, drawn, {}, self.vocab_size or 0)
    return jax.tree.map(lambda a: a[0], state) if single else state

  # -- drawing ----------------------------------------------------------------

  def pick(self, logits: jax.Array, state: SamplerState, mask=None, **inputs) -> tuple[jax.Array, SamplerState]:
    """Draws the next token of every row and accepts it into the window.

    Args:
      logits: ``[V]`` or ``[B, V]``, float32, bfloat16 or float16.
      state: the rows' state, batched like ``logits``.
      mask: optional allowed tokens, bool ``[..., V]`` or packed int32
        ``[..., M]`` (bit ``j % 32`` of word ``j // 32``).
      **inputs: per-call inputs that the chain's stages declare
        (:attr:`inputs`), batched like ``logits``.

    Returns:
      ``(token, state)``: ``token`` is ``[]`` or ``[B]`` int32.

    Examples:
      >>> import jax, jax.numpy as jnp, jsample
      >>> sampler = jsample.llama_cpp()
      >>> state = sampler.init(seed=7, prompt=[2, 10, 11], temperature=0.8)
      >>> token, state = jax.jit(sampler.pick)(jnp.zeros(32), state)
      >>> int(state.position)
      4
    """
    drawn, state = self._one_row_or_batch(self._draw, logits, state, dict(inputs, mask=mask), logprob=False)
    return drawn.token, state

  def pick_with_info(self, logits: jax.Array, state: SamplerState, mask=None, **inputs) -> tuple[Draw, SamplerState]:
    """Like :meth:`pick`, returning a :class:`Draw` (token, valid, logprob) instead of the token.

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.llama_cpp()
      >>> drawn, state = sampler.pick_with_info(jnp.full(8, -jnp.inf), sampler.init(seed=0))
      >>> bool(drawn.valid), int(drawn.token)  # nothing survives: flagged, in range
      (False, 0)
    """
    return self._one_row_or_batch(self._draw, logits, state, dict(inputs, mask=mask), logprob=True)

  def probs(self, logits: jax.Array, state: SamplerState, mask=None, **inputs) -> jax.Array:
    """The distribution :meth:`pick` draws from, as probabilities ``[..., V]``.

    Zero outside the survivors of the chain; one-hot for greedy rows; all
    zero for a row where nothing survives.

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
      >>> p = sampler.probs(jnp.log(jnp.array([0.1, 0.6, 0.3])), sampler.init(seed=0))
      >>> [round(float(v), 3) for v in p]
      [0.0, 0.667, 0.333]
    """
    return self._one_row_or_batch(self._probs, logits, state, dict(inputs, mask=mask))

  def _probs(self, logits, state: SamplerState, inputs: dict) -> jax.Array:
    (raw, mask), rows, single, plan = self._prepare(logits, state, inputs)
    vocab = raw.shape[-1]

    def spread(cands):
      return jax.vmap(lambda x, ids: jnp.zeros(vocab, jnp.float32).at[ids].set(draw.softmax(x), mode="drop"))(
        cands.logits, cands.ids
      )

    def slow(raw, mask, row):
      return draw.softmax(paths.full_row(self.stages, raw, mask, row, plan))

    out = self._decide(raw, mask, rows, plan, spread, slow)
    return out[0] if single else out

  def explain(self, logits: jax.Array, state: SamplerState, mask=None, *, top: int = 5, **inputs) -> list[StageView]:
    """What each stage does to the rows: survivors, entropy and the best tokens after each.

    It runs the full-vocabulary path (exact, and slower than :meth:`pick`),
    draws nothing and leaves the state alone: a view for notebooks and demos.

    Args:
      logits: ``[V]`` or ``[B, V]``.
      state: the rows' state.
      mask: optional allowed tokens, as for :meth:`pick`.
      top: ``n``, how many of the most likely tokens each view lists.
      **inputs: per-call inputs, as for :meth:`pick`.

    Returns:
      A :class:`StageView` for the input row, then one per stage, in order.

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.llama_cpp(top_k=2)
      >>> views = sampler.explain(jnp.log(jnp.array([0.5, 0.3, 0.2])), sampler.init(seed=0), top=2)
      >>> [(v.name, int(v.survivors)) for v in views]
      [('input', 3), ('penalties', 3), ('top_k', 2), ('top_p', 2), ('min_p', 2), ('temperature', 2)]
      >>> [round(float(p), 3) for p in views[2].probs]
      [0.625, 0.375]
    """
    (raw, mask), rows, single, plan = self._prepare(logits, state, dict(inputs, mask=mask))
    vocab = raw.shape[-1]
    n = min(top, vocab)

    def one(raw, mask, row):
      x = paths.full_row((), raw, mask, row, plan)
      views = [_view(x, n)]
      for stage in self.stages:
        x = stage.on_row(x, row.settings, paths.context(stage, row, vocab, plan))
        views.append(_view(x, n))
      return views

    views = jax.vmap(one)(raw, mask, rows)
    names = ("input",) + tuple(stage.name for stage in self.stages)
    if single:
      views = jax.tree.map(lambda a: a[0], views)
    return [StageView(name, *view) for name, view in zip(names, views, strict=True)]

  # -- the draw -----------------------------------------------------------------

  def _one_row_or_batch(self, method, logits, state: SamplerState, inputs: dict, **static):
    """``method(logits, state, inputs)``; for one row ``[V]``, with a batching rule of its own.

    Under ``jax.vmap(sampler.pick)`` JAX would otherwise map the one-row
    program over the rows, and its conditionals would become selects that run
    every branch (the full-vocabulary path included) for every row. The rule
    runs the batched call instead: the same tokens, at the batched call's cost.
    """
    call = functools.partial(method, **static)
    if jnp.ndim(logits) != 1 or self.checking:  # checkify does not cross a custom batching rule
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

  def _draw(self, logits, state: SamplerState, inputs: dict, *, logprob: bool) -> tuple[Draw, SamplerState]:
    (raw, mask), rows, single, plan = self._prepare(logits, state, inputs)
    # pick drops the log-probability, and on a full row it costs an exp per token.
    needs_logprob = logprob or any(stage.update is not None for stage in self.stages)

    def fast(cands):
      return jax.vmap(draw.on_candidates)(cands.logits, cands.ids, rows.bits)

    def slow(raw, mask, row):
      final = paths.full_row(self.stages, raw, mask, row, plan)
      return draw.on_row(final, row.bits, plan.race_row, logprob=needs_logprob)

    drawn = self._decide(raw, mask, rows, plan, fast, slow)
    if self.checking:
      checked.drawn(self, drawn.valid)
    state = self._advance(_batched(state, single), drawn, rows.inputs, raw.shape[-1])
    if single:
      drawn, state = jax.tree.map(lambda a: a[0], (drawn, state))
    return drawn, state

  def _decide(self, raw, mask, rows: paths.Rows, plan: strategies.Strategy, fast, slow):
    """``fast(candidates)`` for the rows the candidates decide, ``slow(row)`` for the others."""
    (first, ok), refine = paths.candidates(self.stages, self.budget, raw, mask, rows, plan)

    def refined():
      cands, better = refine()
      return fast(cands), better

    return plan.decide(ok, fast(first), refined, slow, raw, mask, rows)

  def _advance(self, state: SamplerState, drawn: Draw, inputs: dict, vocab: int) -> SamplerState:
    """Accepts the drawn tokens and updates the stages' own state; batched rows."""
    # A row where nothing survived still advances, with an empty window slot.
    accepted = jnp.where(drawn.valid, drawn.token, -1)
    stages = dict(state.stages)
    updating = [stage for stage in self.stages if stage.update is not None]
    if updating:
      bits = jax.vmap(noise.step_bits)(state.key, state.position)
      rows = paths.Rows(state.settings, state.window, state.position, bits, inputs, state.stages)
      plan = strategies.resolve(self.strategy)

      def update(stage, row, token, logprob):
        ctx = paths.context(stage, row, vocab, plan)
        return stage.update(ctx.state, token, logprob, row.settings, ctx)

      for stage in updating:
        stages[stage.name] = jax.vmap(lambda r, t, lp, s=stage: update(s, r, t, lp))(rows, accepted, drawn.logprob)
    window, position = jax.vmap(append)(state.window, state.position, accepted)
    return state._replace(window=window, position=position, stages=stages)

  def _prepare(self, logits, state: SamplerState, inputs: dict):
    """Checks the inputs; returns ``((raw, mask), rows, single, strategy)`` with a batch axis.

    The logits stay as given: each reader cleans what it reads (see
    :func:`cut.clean`), so no float32 copy of the batch is ever written.
    """
    logits = jnp.asarray(logits)
    validation.logits(logits, self.vocab_size)
    if state.position.shape != logits.shape[:-1]:
      raise ValueError(
        f"state: holds rows of shape {state.position.shape}, logits {logits.shape} need {logits.shape[:-1]}"
      )
    given = {name: jnp.asarray(value) for name, value in inputs.items() if value is not None}
    validation.inputs(given, self.inputs, logits.shape)
    missing = sorted(set(self.inputs) - set(given))
    if missing:
      raise ValueError(f"{missing[0]}: the stage {self.inputs[missing[0]]!r} needs this input; pass it to the call")
    # Window ids outside the vocabulary count for no token; say so where they can be seen.
    validation.tokens("state.window", state.window, logits.shape[-1], lowest=-1)
    if self.checking:
      checked.inputs(self, logits, state)
    single = logits.ndim == 1
    if single:
      logits, given, state = jax.tree.map(lambda a: a[None], (logits, given, state))
    mask = given.pop("mask", None)
    bits = jax.vmap(noise.step_bits)(state.key, state.position)
    rows = paths.Rows(state.settings, state.window, state.position, bits, given, state.stages)
    return (logits, mask), rows, single, strategies.resolve(self.strategy)


def _batched(state: SamplerState, single: bool) -> SamplerState:
  return jax.tree.map(lambda a: a[None], state) if single else state


def _view(x: jax.Array, n: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  p = draw.softmax(x)
  entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
  probs, ids = lax.top_k(p, n)
  return jnp.sum(x > -jnp.inf, dtype=jnp.int32), entropy, ids.astype(jnp.int32), probs


def chain(
  *stages: Stage,
  window_size: int = 64,
  budget: int = 128,
  vocab_size: int | None = None,
  strategy: str = "auto",
) -> Sampler:
  """Composes stages, in the order given, into a :class:`Sampler`.

  The sampler draws from whatever survives the last stage: with temperature
  ``t``, from ``softmax(logits / t)`` over the survivors.

  Args:
    *stages: :class:`Stage` s such as :func:`top_k` or :func:`temperature`.
    window_size: ``W``, the capacity of the recent-token ring buffer.
    budget: ``K``, how many candidates the fast path keeps after its cut.
    vocab_size: optional ``V``, to check prompts and logits against.
    strategy: ``"auto"`` (by JAX's backend), ``"cpu"`` or ``"accelerator"``.

  Returns:
    A :class:`Sampler`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
    >>> token, state = sampler.pick(jnp.array([0.0, 5.0, 4.0, -1.0]), sampler.init(seed=0))
    >>> int(token) in (1, 2)
    True
  """
  for stage in stages:
    if not isinstance(stage, Stage):
      raise ValueError(f"stages: expected Stage objects (jsample.top_k(...), ...); got {stage!r}")
  return Sampler(tuple(stages), window_size=window_size, budget=budget, vocab_size=vocab_size, strategy=strategy)
