"""Samplers: a chain of stages, its state, and the pure functions on it."""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src import checked, cut, masks, noise
from jsample._src.stage import Candidates, Context, Setting, Stage, logsumexp, sort_candidates


class SamplerState(NamedTuple):
  """Everything a row carries from step to step: a pytree of arrays.

  Shapes are for a batch of ``B`` rows; a single row drops the ``B`` axis.

  Attributes:
    key: ``[B]`` typed PRNG keys, one per row. The step key is
      ``fold_in(key, position)``, so a row's draw never depends on its batch.
    position: ``[B]`` int32, tokens accepted so far (prompt included).
    window: ``[B, W]`` int32 ring buffer of recent tokens, ``-1`` when empty;
      token number ``n`` sits at ``n % W``.
    settings: name -> ``[B]`` array, one value per row for every setting.
  """

  key: jax.Array
  position: jax.Array
  window: jax.Array
  settings: dict[str, jax.Array]


class Draw(NamedTuple):
  """What :meth:`Sampler.pick_with_info` returns besides the new state.

  Attributes:
    token: ``[B]`` int32, always in ``[0, V)``.
    valid: ``[B]`` bool; False when no token survived (every logit masked,
      ``-inf`` or NaN). ``token`` is then 0.
    logprob: ``[B]`` float32 log-probability of ``token`` under the final
      distribution the draw used (0 for greedy rows and invalid rows).
  """

  token: jax.Array
  valid: jax.Array
  logprob: jax.Array


def _is_concrete(value) -> bool:
  return not isinstance(value, jax.core.Tracer)


def _check_setting(setting: Setting, value) -> None:
  if not _is_concrete(value):
    return
  v = np.asarray(value)
  if not np.issubdtype(v.dtype, np.number):
    raise ValueError(f"{setting.name}: must be a number or an array of numbers; got {v.dtype}")
  if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v)):
    raise ValueError(f"{setting.name}: must be finite; got {value!r}")
  if setting.dtype == jnp.int32 and not np.all(np.mod(v, 1) == 0):
    raise ValueError(f"{setting.name}: must be an integer; got {value!r}")
  # The state holds the value in the setting's dtype: check what it will hold
  # (1e39 overflows float32, 1e-50 rounds to 0, 2**40 wraps in int32).
  info = np.iinfo(np.int32) if setting.dtype == jnp.int32 else np.finfo(np.float32)
  if np.any(v < info.min) or np.any(v > info.max):
    raise ValueError(f"{setting.name}: must fit in {np.dtype(setting.dtype).name}; got {value!r}")
  stored = v.astype(setting.dtype)
  if not np.all(setting.valid(stored)):
    held = f", which {np.dtype(setting.dtype).name} holds as {stored.tolist()}" if np.all(setting.valid(v)) else ""
    raise ValueError(f"{setting.name}: must be {setting.allowed}; got {value!r}{held}")


def _as_prompt(prompt) -> np.ndarray | jax.Array:
  """A prompt as ``[L]`` or ``[B, L]`` integers, lists of lists padded with -1."""
  if isinstance(prompt, (list, tuple)):
    nested = bool(prompt) and all(np.ndim(p) == 1 for p in prompt)
    try:
      rows = [np.asarray(p) for p in prompt] if nested else [np.asarray(prompt)]
    except ValueError as error:
      raise ValueError(f"prompt: must be [L], [B, L] or a list of lists of token ids; {error}") from None
    for row in rows:
      if row.size and not np.issubdtype(row.dtype, np.integer):
        raise ValueError(f"prompt: token ids must be integers; got dtype {row.dtype}")
    if not nested:
      prompt = rows[0].astype(np.int64) if rows[0].size else np.zeros((0,), np.int64)
    else:
      prompt = np.full((len(rows), max(r.size for r in rows)), -1, np.int64)
      for i, row in enumerate(rows):
        prompt[i, : row.size] = row
  elif not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise ValueError(f"prompt: token ids must be integers; got dtype {prompt.dtype}")
  if prompt.ndim not in (1, 2):
    raise ValueError(f"prompt: must be [L] or [B, L]; got shape {prompt.shape}")
  return prompt


def _check_tokens(name: str, ids, vocab_size: int | None, lowest: int) -> None:
  """Concrete token ids must lie in ``[lowest, vocab_size)``."""
  if not _is_concrete(ids):
    return
  ids = np.asarray(ids)
  if np.any(ids < lowest):
    raise ValueError(f"{name}: token ids must be >= 0" + (" (or -1 for padding)" if lowest < 0 else ""))
  if vocab_size is not None and np.any(ids >= vocab_size):
    raise ValueError(f"{name}: token ids must be in [0, {vocab_size}) (the vocabulary)")


def _load(window: jax.Array, position: jax.Array, prompt: jax.Array):
  """Appends one row's prompt (``-1`` entries skipped) to its ring buffer."""
  (width,) = window.shape
  present = prompt >= 0
  rank = jnp.cumsum(present.astype(jnp.int32)) - 1
  count = jnp.sum(present.astype(jnp.int32))
  if width:
    # Only the last W tokens fit; they land on distinct slots.
    fits = present & (rank >= count - width)
    slot = jnp.where(fits, jnp.mod(position + rank, width), width)
    window = window.at[slot].set(prompt, mode="drop")
  return window, position + count


def _accept(window: jax.Array, position: jax.Array, token: jax.Array):
  (width,) = window.shape
  if width:
    window = window.at[jnp.mod(position, width)].set(token)
  return window, position + 1


@dataclasses.dataclass(frozen=True)
class Sampler:
  """A chain of stages and the pure functions that run it.

  Build one with :func:`chain` or a recipe (:func:`llama_cpp`, :func:`gemma`,
  :func:`hf`). Every method is a pure function of arrays and works under
  ``jit``, ``vmap`` and inside ``lax.scan``/``lax.while_loop``.

  Attributes:
    stages: the stages, in the order they act.
    window: ``W``, the ring buffer's capacity (static).
    candidates: ``K``, the candidate budget of the fast path (static). It
      changes speed only, never a token.
    vocab_size: ``V`` if known; then prompts and logits are checked against it.
    checking: what :meth:`checked` turned on; None for an unchecked sampler.
  """

  stages: tuple[Stage, ...]
  window_size: int = 64
  budget: int = 128
  vocab_size: int | None = None
  checking: checked.Checks | None = None

  def __post_init__(self):
    if self.window_size < 0:
      raise ValueError(f"window_size: must be >= 0; got {self.window_size}")
    if self.budget < 1:
      raise ValueError(f"budget: must be >= 1; got {self.budget}")
    if self.vocab_size is not None and self.vocab_size < 1:
      raise ValueError(f"vocab_size: must be >= 1; got {self.vocab_size}")
    names = [s.name for stage in self.stages for s in stage.settings]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
      raise ValueError(f"stages: each setting may belong to one stage only; repeated: {repeated}")
    for setting in self.settings.values():
      self._check(setting.name, setting.default)
    cut_at = next((i for i, stage in enumerate(self.stages) if not stage.before_cut), len(self.stages))
    late = [stage.name for stage in self.stages[cut_at:] if stage.before_cut]
    if late:
      raise ValueError(
        f"stages: {late} act on the full row before the cut to candidates, so they must come before "
        f"every other stage; got the order {[stage.name for stage in self.stages]}"
      )

  def _check(self, name: str, value) -> None:
    _check_setting(self.settings[name], value)
    if name == "penalty_last_n" and _is_concrete(value) and np.any(np.asarray(value) > self.window_size):
      raise ValueError(
        f"penalty_last_n: must be <= window={self.window_size} (the ring buffer's capacity); got {value!r}. "
        "Build the sampler with a larger window."
      )

  @property
  def settings(self) -> dict[str, Setting]:
    """Every setting of the chain, by name."""
    return {s.name: s for stage in self.stages for s in stage.settings}

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
        ``top_p=[0.9, 1.0]``), each a scalar or one value per row.

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
      self._check(name, value)
    if key is not None and not jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
      raise ValueError(
        "key: must be typed PRNG keys from jax.random.key (or jax.random.wrap_key_data); "
        f"got dtype {jnp.asarray(key).dtype}"
      )
    if seed is not None and _is_concrete(seed):
      seeds = np.asarray(seed)
      if not np.issubdtype(seeds.dtype, np.integer) or np.any(seeds < 0) or np.any(seeds >= 2**32):
        raise ValueError(f"seed: must be integers in [0, 2**32); got {seed!r}")
    if prompt is not None:
      prompt = _as_prompt(prompt)

    shapes = {name: np.shape(v) for name, v in settings.items()}
    if seed is not None:
      shapes["seed"] = np.shape(seed)
    if key is not None:
      shapes["key"] = np.shape(key)
    if prompt is not None and prompt.ndim == 2:
      shapes["prompt"] = prompt.shape[:1]
    for name, shape in shapes.items():
      if len(shape) > 1:
        raise ValueError(f"{name}: must be a scalar or one value per row [B]; got shape {shape}")
    sizes = {name: shape[0] for name, shape in shapes.items() if shape}
    if batch is not None:
      sizes["batch"] = batch
    if len(set(sizes.values())) > 1:
      raise ValueError(f"batch sizes disagree: {sizes}")
    rows = () if not sizes else (next(iter(sizes.values())),)

    if key is None:
      seeds = jnp.broadcast_to(jnp.asarray(0 if seed is None else seed, jnp.uint32), rows)
      key = jax.vmap(jax.random.key)(seeds.reshape(-1)).reshape(rows)
    else:
      key = jnp.broadcast_to(key, rows)
    values = {
      name: jnp.broadcast_to(jnp.asarray(settings.get(name, s.default), s.dtype), rows) for name, s in known.items()
    }
    state = SamplerState(
      key=key,
      position=jnp.zeros(rows, jnp.int32),
      window=jnp.full(rows + (self.window_size,), -1, jnp.int32),
      settings=values,
    )
    return state if prompt is None else self.load_prompt(state, prompt)

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
      if np.ndim(value) > len(rows):
        raise ValueError(f"{name}: the state holds one row, so give a scalar; got shape {np.shape(value)}")
    fresh = self.init(key=state.key, **settings)
    updated = {name: jnp.broadcast_to(fresh.settings[name], rows) for name in settings}
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
    """
    prompt = _as_prompt(prompt)
    _check_tokens("prompt", prompt, self.vocab_size, lowest=-1)
    if self.checking:
      checked.tokens("prompt", prompt, self.vocab_size, lowest=-1)
    batched = state.position.ndim == 1
    if prompt.ndim == 2 and not batched:
      raise ValueError(f"prompt: a [B, L] prompt needs a batched state; got shape {prompt.shape}")
    prompt = jnp.asarray(prompt, jnp.int32)
    if batched:
      prompt = jnp.broadcast_to(prompt, state.position.shape + prompt.shape[-1:])
      window, position = jax.vmap(_load)(state.window, state.position, prompt)
    else:
      window, position = _load(state.window, state.position, prompt)
    return state._replace(window=window, position=position)

  def accept(self, state: SamplerState, token: jax.Array) -> SamplerState:
    """Appends tokens chosen by the caller (speculative decoding, forced tokens).

    Args:
      state: the rows' state.
      token: ``[]`` or ``[B]`` int32, matching the state.

    Returns:
      ``state`` with ``token`` in the window and ``position + 1``.
    """
    if not jnp.issubdtype(jnp.asarray(token).dtype, jnp.integer):
      raise ValueError(f"token: must be integer token ids; got dtype {jnp.asarray(token).dtype}")
    _check_tokens("token", token, self.vocab_size, lowest=0)
    if self.checking:
      checked.tokens("token", token, self.vocab_size, lowest=0)
    token = jnp.asarray(token, jnp.int32)
    if token.shape != state.position.shape:
      raise ValueError(f"token: must have shape {state.position.shape} to match the state; got {token.shape}")
    step = _accept
    for _ in range(state.position.ndim):
      step = jax.vmap(step)
    window, position = step(state.window, state.position, token)
    return state._replace(window=window, position=position)

  # -- drawing ----------------------------------------------------------------

  def pick(self, logits: jax.Array, state: SamplerState, mask=None) -> tuple[jax.Array, SamplerState]:
    """Draws the next token of every row and accepts it into the window.

    Args:
      logits: ``[V]`` or ``[B, V]``, float32, bfloat16 or float16.
      state: the rows' state, batched like ``logits``.
      mask: optional allowed tokens, bool ``[..., V]`` or packed int32
        ``[..., M]`` (bit ``j % 32`` of word ``j // 32``).

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
    drawn, state = self._draw(logits, state, mask, logprob=False)
    return drawn.token, state

  def pick_with_info(self, logits: jax.Array, state: SamplerState, mask=None) -> tuple[Draw, SamplerState]:
    """Like :meth:`pick`, returning a :class:`Draw` (token, valid, logprob).

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.llama_cpp()
      >>> drawn, state = sampler.pick_with_info(jnp.full(8, -jnp.inf), sampler.init(seed=0))
      >>> bool(drawn.valid), int(drawn.token)  # nothing survives: flagged, in range
      (False, 0)
    """
    return self._draw(logits, state, mask, logprob=True)

  def _draw(self, logits, state: SamplerState, mask, *, logprob: bool) -> tuple[Draw, SamplerState]:
    rows, state, single = self._prepare(logits, state, mask)
    words = jax.vmap(noise.step_bits)(state.key, state.position)
    cands, ok = self._candidates(rows, state)
    fast = jax.vmap(_finish)(cands.logits, cands.ids, words)

    def slow(raw, mask, settings, window, position, words):
      final = _relative(self._full_row(raw, mask, settings, window, position))
      token, valid = noise.race_row(final, words)
      if not logprob:  # pick drops it, and on a full row it costs an exp per token
        return Draw(token, valid, jnp.float32(0))
      return Draw(token, valid, jnp.where(valid, final[token] - logsumexp(final), 0.0))

    drawn = _per_row(ok, fast, slow, *rows, state.settings, state.window, state.position, words)
    if self.checking:
      checked.drawn(self, drawn.valid)
    # A row where nothing survived still advances, with an empty window slot.
    accepted = jnp.where(drawn.valid, drawn.token, -1)
    window, position = jax.vmap(_accept)(state.window, state.position, accepted)
    state = state._replace(window=window, position=position)
    if single:
      drawn, state = jax.tree.map(lambda a: a[0], (drawn, state))
    return drawn, state

  def probs(self, logits: jax.Array, state: SamplerState, mask=None) -> jax.Array:
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
    rows, state, single = self._prepare(logits, state, mask)
    cands, ok = self._candidates(rows, state)
    vocab = jnp.shape(logits)[-1]

    def spread(logits, ids):
      return jnp.zeros(vocab, jnp.float32).at[ids].set(_softmax(logits))

    def slow(*row):
      return _softmax(self._full_row(*row))

    fast = jax.vmap(spread)(cands.logits, cands.ids)
    out = _per_row(ok, fast, slow, *rows, state.settings, state.window, state.position)
    return out[0] if single else out

  def _prepare(self, logits, state: SamplerState, mask):
    """Checks the inputs; returns them with a batch axis, and whether it was added.

    The logits stay as given: each reader cleans what it reads (see
    :func:`cut.clean`), so no float32 copy of the batch is ever written.
    """
    logits = jnp.asarray(logits)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
      raise ValueError(f"logits: must be float32, bfloat16 or float16; got {logits.dtype}")
    if logits.ndim not in (1, 2):
      raise ValueError(f"logits: must be [V] or [B, V]; got shape {logits.shape}")
    vocab = logits.shape[-1]
    if vocab < 1:
      raise ValueError("logits: the vocabulary must hold at least one token")
    if self.vocab_size is not None and vocab != self.vocab_size:
      raise ValueError(f"logits: width {vocab} differs from the sampler's vocab_size={self.vocab_size}")
    if state.position.shape != logits.shape[:-1]:
      raise ValueError(
        f"state: holds rows of shape {state.position.shape}, logits {logits.shape} need {logits.shape[:-1]}"
      )
    if mask is not None:
      mask = jnp.asarray(mask)
      masks.check(mask, logits.shape)
    if self.checking:
      checked.inputs(self, logits, state)
    single = logits.ndim == 1
    if single:
      logits, mask = logits[None], None if mask is None else mask[None]
      state = jax.tree.map(lambda a: a[None], state)
    return (logits, mask), state, single

  def _candidates(self, rows, state: SamplerState):
    """Runs the chain on candidates; returns them and the rows they are exact for."""
    per_row = (state.settings, state.window, state.position)
    vocab = rows[0].shape[-1]
    # Penalties that only lower logits change the window's tokens alone, so at
    # most min(W, K) of the best K + min(W, K) raw tokens fall out of the K best;
    # _cut_row checks that and flags a row when more did.
    extra = min(self.window_size, self.budget) if any(s.before_cut for s in self.stages) else 0
    wide = min(vocab, self.budget + extra)
    logits, ids = cut.top_candidates(*rows, wide)
    candidates = jax.vmap(functools.partial(self._cut_row, vocab=vocab))(logits, ids, *per_row)
    # The row's log-normaliser costs an exp per token, so the chain first runs
    # without it; only if some row needs it is it computed, for the batch.
    unchanged = ~jnp.isnan(candidates.total)
    chain_row = jax.vmap(functools.partial(self._chain_row, vocab=vocab))

    def run(total):
      return chain_row(candidates._replace(total=total), *per_row)

    def with_total():
      return run(jnp.where(unchanged, cut.log_normalisers(*rows, logits[:, 0]), jnp.nan))

    first = run(jnp.full(candidates.total.shape, jnp.nan))
    cands = _merge(first.exact & first.complete, first, with_total)
    return cands, cands.exact & cands.complete

  def _cut_row(self, logits, ids, settings, window, position, *, vocab: int) -> Candidates:
    """The ``K`` best tokens of one row, from the ``wide`` best before the stages
    that run before the cut (which only change tokens of the window).

    Exact when the ``K``-th best after those stages still beats every token
    outside the ``wide`` (each at most the last raw candidate). Its ``total``
    is a placeholder: 0 where the row's log-normaliser still holds after
    those stages, NaN where they changed it.
    """
    (wide,) = ids.shape
    ctx = Context(window, position, vocab)
    whole = (wide == vocab) | (logits[-1] == -jnp.inf)
    c = Candidates(ids, logits, jnp.float32(0), whole, jnp.bool_(True))
    before = [s for s in self.stages if s.before_cut]
    for stage in before:
      c = stage.on_candidates(c, settings, ctx)
    if before:
      ids, penalised = sort_candidates(c.ids, c.logits)
      kept = min(self.budget, wide)
      c = c._replace(
        ids=ids[:kept],
        logits=penalised[:kept],
        complete=(kept == vocab) | (penalised[kept - 1] == -jnp.inf),
        exact=c.exact & (whole | (penalised[kept - 1] > logits[-1])),
      )
    return c

  def _chain_row(self, c: Candidates, settings, window, position, *, vocab: int) -> Candidates:
    """The ``O(K)`` rest of the candidate path, for one row."""
    ctx = Context(window, position, vocab)
    for stage in self.stages:
      if not stage.before_cut:
        c = stage.on_candidates(c, settings, ctx)
    return c

  def _full_row(self, raw, mask, settings, window, position) -> jax.Array:
    """The full-vocabulary path for one row: every stage on ``[V]``, no sort."""
    x = cut.full_row(raw, mask)
    ctx = Context(window, position, x.shape[0])
    for stage in self.stages:
      x = stage.on_row(x, settings, ctx)
    return x


def _per_row(ok: jax.Array, fast, slow, *rows):
  """Per row, ``fast`` where ``ok``, else ``slow(*row)``.

  ``slow`` runs row by row, and only for the rows that need it: its ``O(V)``
  temporaries exist for one row at a time, and a batch where every row is
  ``ok`` pays nothing for it. (Rows are indexed inside the loop, not mapped
  over: mapping would copy the whole batch of logits first.)
  """

  def one(i):
    pick = functools.partial(jax.tree.map, lambda a: a[i])
    return lax.cond(ok[i], lambda: pick(fast), lambda: slow(*pick(rows)))

  if not ok.shape[0]:  # no rows: nothing to index
    return fast
  # The loop carries the logits, which XLA copies in first: skip it when it has nothing to do.
  return lax.cond(jnp.all(ok), lambda: fast, lambda: lax.map(one, jnp.arange(ok.shape[0])))


def _merge(ok: jax.Array, fast, slow):
  """Per row, ``fast`` where ``ok``; ``slow()`` runs once, only if some row needs it."""
  full = lax.cond(jnp.all(ok), lambda: fast, slow)
  return jax.tree.map(lambda a, b: jnp.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, b), fast, full)


def _relative(logits: jax.Array) -> jax.Array:
  """The logits minus the best one. Near the largest float, ``best + log Σ exp``
  rounds to ``best``: ties there (several +inf tokens) would each get mass 1."""
  best = jnp.max(logits)
  return logits - jnp.where(best > -jnp.inf, best, 0.0)


def _softmax(logits: jax.Array) -> jax.Array:
  """Probabilities of the survivors; all zero when nothing survives."""
  e = jnp.where(logits > -jnp.inf, jnp.exp(_relative(logits)), 0.0)
  return e / jnp.maximum(jnp.sum(e), 1.0)  # the best survivor alone adds 1


def _finish(logits: jax.Array, ids: jax.Array, words: jax.Array) -> Draw:
  logits = _relative(logits)
  token, valid = noise.race(logits, ids, words)
  chosen = jnp.max(jnp.where(ids == token, logits, -jnp.inf))
  return Draw(token, valid, jnp.where(valid, chosen - logsumexp(logits), 0.0))


def chain(*stages: Stage, window_size: int = 64, budget: int = 128, vocab_size: int | None = None) -> Sampler:
  """Composes stages, in the order given, into a :class:`Sampler`.

  The sampler draws from whatever survives the last stage: with temperature
  ``t``, from ``softmax(logits / t)`` over the survivors.

  Args:
    *stages: :class:`Stage` s such as :func:`top_k` or :func:`temperature`.
    window: ``W``, the capacity of the recent-token ring buffer.
    candidates: ``K``, how many candidates the fast path keeps after its cut.
    vocab_size: optional ``V``, to check prompts and logits against.

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
  return Sampler(tuple(stages), window_size=window_size, budget=budget, vocab_size=vocab_size)
