"""Samplers: a chain of stages and the pure functions that run it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jsample._src import checked, explain, run, speculative, validation
from jsample._src.draw import Draw
from jsample._src.stage import Setting, Stage
from jsample._src.state import SamplerState, as_prompt, create, fork, load_prompt


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
      :mod:`jsample._src.kernels.strategy`); the tokens are the same.
    checking: what :meth:`checked` turned on; None for an unchecked sampler.

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(0.0))
    >>> token, state = jax.jit(sampler.pick)(jnp.array([[0.1, 3.0, 2.0]]), sampler.init(seed=[0]))
    >>> token.tolist(), state.position.tolist()
    ([1], [1])
  """

  stages: tuple[Stage, ...]
  window_size: int = 64
  budget: int = 128
  vocab_size: int | None = None
  strategy: str = "auto"
  checking: checked.Checks | None = None

  def __repr__(self) -> str:
    """The stages in order and the static sizes: the stages' functions would say nothing a reader can use.

    Examples:
      >>> import jsample
      >>> jsample.chain(jsample.top_k(40), jsample.temperature(0.8))
      Sampler(top_k → temperature; window_size=64, budget=128, strategy='auto')
      >>> jsample.gemma(vocab_size=1000, budget=64).checked()  # doctest: +NORMALIZE_WHITESPACE
      Sampler(penalties → top_k → top_p → min_p → temperature;
              window_size=64, budget=64, vocab_size=1000, strategy='auto', checked)
    """
    sizes = f"window_size={self.window_size}, budget={self.budget}"
    if self.vocab_size is not None:
      sizes += f", vocab_size={self.vocab_size}"
    sizes += f", strategy={self.strategy!r}" + (", checked" if self.checking is not None else "")
    return f"Sampler({' → '.join(stage.name for stage in self.stages)}; {sizes})"

  def __post_init__(self):
    validation.chain(self.stages, self.window_size, self.budget, self.vocab_size, self.strategy)
    for setting in self.settings.values():
      self._check(setting, setting.default)

  @functools.cached_property
  def _programs(self) -> dict:
    """The compiled programs of calls made outside ``jit`` (:func:`run.compiled`), by method and static options."""
    return {}

  def _check(self, setting: Setting, value) -> None:  # a setting's value against the static sizes it may name
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
    fresh, prompt = create(
      self.settings, self.stages, self.window_size, self._check, seed, key, batch, prompt, settings
    )
    return fresh if prompt is None else self.load_prompt(prompt, fresh)

  def configure(self, state: SamplerState, **settings) -> SamplerState:
    """Returns ``state`` with new setting values; nothing recompiles.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp()
      >>> state = sampler.configure(sampler.init(seed=0), temperature=0.0)
      >>> float(state.settings["temperature"])
      0.0
    """
    validation.state_last("configure(state, **settings)", state)
    validation.rows_match(self.settings, state, settings)
    fresh = self.init(key=state.key, **settings)
    updated = {name: jnp.broadcast_to(fresh.settings[name], state.settings[name].shape) for name in settings}
    return state._replace(settings={**state.settings, **updated})

  def load_prompt(self, prompt, state: SamplerState) -> SamplerState:
    """Loads prompt tokens into the window, as llama-server does before its first draw.

    Args:
      prompt: ``[L]`` token ids for one row (or for every row of a batch),
        ``[B, L]`` padded with ``-1``, or a list of lists.
      state: the rows' state.

    Returns:
      ``state`` with the last ``W`` prompt tokens in the window and
      ``position`` advanced by the prompt's length.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp(window_size=4)
      >>> state = sampler.load_prompt([5, 6, 7, 8, 9], sampler.init(seed=0))
      >>> state.window.tolist(), int(state.position)
      ([9, 6, 7, 8], 5)
    """
    validation.state_last("load_prompt(prompt, state)", prompt, state)
    prompt = as_prompt(prompt)
    validation.tokens("prompt", prompt, self.vocab_size, lowest=-1)
    if self.checking:
      checked.tokens("prompt", prompt, self.vocab_size, lowest=-1)
    return load_prompt(prompt, state)

  def fork(self, state: SamplerState, *, n: int) -> SamplerState:
    """``n`` samples per row: each row becomes ``n`` rows in a row, each with its own stream.

    Copy ``j`` of a row draws with the stream ``jax.random.fold_in(key, j)``
    of the row's key, so its tokens are those of a row initialised with that
    key: reproducible, and independent of ``n`` and of the other rows. Repeat
    the logits alike (``jnp.repeat(logits, n, axis=0)``); the model then
    decodes the ``B * n`` rows as one batch.

    Args:
      state: ``[B]`` rows (one row: ``[]``, which becomes ``[n]``).
      n: the number of samples per row (static).

    Returns:
      The ``[B * n]`` rows' state.

    Examples:
      >>> import jax, jax.numpy as jnp, jsample
      >>> sampler = jsample.gemma()
      >>> state = sampler.fork(sampler.init(seed=[1, 2]), n=3)
      >>> state.position.shape
      (6,)
      >>> tokens, state = sampler.pick(jnp.repeat(jnp.zeros((2, 50)), 3, axis=0), state)
      >>> alone = sampler.init(key=jax.random.fold_in(jax.random.key(2), 1))
      >>> int(tokens[4]) == int(sampler.pick(jnp.zeros(50), alone)[0])  # row 1, copy 1
      True
    """
    validation.state_last("fork(state, n=...)", state)
    if not isinstance(n, int) or n < 1:
      raise ValueError(f"n: must be an int >= 1; got {n!r}")
    return fork(state, n)

  def accept(self, token: jax.Array, state: SamplerState) -> SamplerState:
    """Appends tokens chosen by the caller (speculative decoding, forced tokens).

    Stages that keep state update it as after a draw, with the token's
    log-probability unknown (NaN).

    Args:
      token: ``[]`` or ``[B]`` int32, matching the state.
      state: the rows' state.

    Returns:
      ``state`` with ``token`` in the window and ``position + 1``.

    Examples:
      >>> import jsample
      >>> sampler = jsample.llama_cpp(window_size=4)
      >>> state = sampler.accept(7, sampler.init(seed=0))
      >>> state.window.tolist(), int(state.position)
      ([7, -1, -1, -1], 1)
    """
    validation.state_last("accept(token, state)", token, state)
    validation.tokens("token", token, self.vocab_size, lowest=0)
    if self.checking:
      checked.tokens("token", token, self.vocab_size, lowest=0)
    return run.accept(self, jnp.asarray(token, jnp.int32), state)

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
      >>> sampler = jsample.gemma()
      >>> state = sampler.init(seed=7, prompt=[2, 10, 11], temperature=0.8)
      >>> token, state = jax.jit(sampler.pick)(jnp.zeros(32), state)
      >>> int(state.position)
      4
    """
    validation.state_last("pick(logits, state)", logits, state)
    drawn, state = run.one_row_or_batch(self, run.draws, logits, state, dict(inputs, mask=mask), logprob=False)
    return drawn.token, state

  def pick_with_info(
    self, logits: jax.Array, state: SamplerState, mask=None, *, top_logprobs=None, **inputs
  ) -> tuple[Draw, SamplerState]:
    """Like :meth:`pick`, returning a :class:`Draw` (token, valid, logprob) instead of the token.

    Args:
      logits: ``[V]`` or ``[B, V]``, as for :meth:`pick`.
      state: the rows' state, batched like ``logits``.
      mask: optional allowed tokens, as for :meth:`pick`.
      top_logprobs: optional; an int ``n`` (static) asks also for the token
        under the model's own distribution (``Draw.raw``: its log-probability
        and rank, the ``n`` most likely tokens), a tuple ``(n, per_row)`` for
        rows that each want ``per_row [B] <= n`` of them. It costs a few
        passes over the rows.
      **inputs: per-call inputs of the chain's stages, as for :meth:`pick`.

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.gemma()
      >>> drawn, state = sampler.pick_with_info(jnp.full(8, -jnp.inf), sampler.init(seed=0))
      >>> bool(drawn.valid), int(drawn.token)  # nothing survives: flagged, in range
      (False, 0)
      >>> sampler = jsample.gemma(temperature=0.0)
      >>> drawn, _ = sampler.pick_with_info(jnp.log(jnp.array([0.2, 0.5, 0.3])), state, top_logprobs=2)
      >>> int(drawn.raw.rank), drawn.raw.top_ids.tolist(), round(float(drawn.raw.logprob), 3)
      (1, [1, 2], -0.693)
    """
    validation.state_last("pick_with_info(logits, state)", logits, state)
    top, per_row = top_logprobs if isinstance(top_logprobs, tuple) else (top_logprobs, None)
    given = dict(inputs, mask=mask, top_logprobs=per_row)
    return run.one_row_or_batch(self, run.draws, logits, state, given, logprob=True, top_logprobs=top)

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
    validation.state_last("probs(logits, state)", logits, state)
    return run.one_row_or_batch(self, run.probs, logits, state, dict(inputs, mask=mask))

  def verify(
    self, draft_tokens, draft_probs, target_logits: jax.Array, state: SamplerState, mask=None, **inputs
  ) -> tuple[jax.Array, jax.Array, SamplerState]:
    """Speculative decoding: keeps a prefix of a draft's tokens, then adds one token of the target's own.

    Draft token ``x_j`` is kept with probability ``min(1, p_j(x_j) / q_j(x_j))``,
    where ``p_j`` is what :meth:`probs` gives at that position, with the state
    after the draft's first ``j`` tokens. The first token refused is replaced
    by a draw from ``norm(max(0, p_j - q_j))``; a draft kept whole earns
    :meth:`pick`'s own token at row ``L``. Each emitted token thus follows
    ``p_j`` exactly, whatever ``q``, from the row's own stream (see the
    speculative-decoding guide).

    Args:
      draft_tokens: ``[B, L]`` int32 the draft's tokens (one row: ``[L]``).
      draft_probs: ``[B, L, V]`` the draft's probabilities of them, as it drew
        them (``q_j``; non-negative and finite, which is not checked); None
        for a deterministic draft (``q_j`` one-hot on ``x_j``: greedy drafts,
        n-gram lookup).
      target_logits: ``[B, L + 1, V]`` the target's logits at the draft's
        positions and one more.
      state: the rows' state before the draft's first token.
      mask: optional allowed tokens per target row, bool ``[B, L + 1, V]`` or
        packed int32 ``[B, L + 1, M]``.
      **inputs: per-call inputs of the chain's stages, one per target row
        (``[B, L + 1, ...]``).

    Returns:
      ``(tokens, accepted, state)``: ``tokens [B, L + 1]`` int32, the kept
      draft tokens, then the correction or bonus token, then ``-1``;
      ``accepted [B]`` int32 the draft tokens kept (``accepted + 1`` emitted);
      the state after the emitted tokens, as after picking them one by one.
      A row where nothing survives at its last emitted position gets token
      0 there and an empty window slot, as :meth:`pick` gives it.

    Examples:
      >>> import jax.numpy as jnp, jsample
      >>> sampler = jsample.gemma(temperature=0.0)  # greedy: the draft is kept while it is the argmax
      >>> logits = jnp.log(jnp.array([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]]))  # [L + 1, V]
      >>> tokens, accepted, state = sampler.verify(jnp.array([1, 2]), None, logits, sampler.init(seed=0))
      >>> tokens.tolist(), int(accepted), int(state.position)
      ([1, 0, -1], 1, 2)

    References:
      Leviathan, Kalman and Matias, "Fast Inference from Transformers via
      Speculative Decoding", ICML 2023; Chen et al., "Accelerating Large
      Language Model Decoding with Speculative Sampling", 2023.
    """
    validation.state_last(
      "verify(draft_tokens, draft_probs, target_logits, state)", draft_tokens, draft_probs, target_logits, state
    )
    return speculative.verify(self, draft_tokens, draft_probs, target_logits, state, mask, inputs)

  def explain(
    self, logits: jax.Array, state: SamplerState, mask=None, *, top: int = 5, **inputs
  ) -> list[explain.StageView]:
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
      >>> sampler = jsample.gemma(top_k=2)
      >>> views = sampler.explain(jnp.log(jnp.array([0.5, 0.3, 0.2])), sampler.init(seed=0), top=2)
      >>> [(v.name, int(v.survivors)) for v in views]
      [('input', 3), ('penalties', 3), ('top_k', 2), ('top_p', 2), ('min_p', 2), ('temperature', 2)]
      >>> [round(float(p), 3) for p in views[2].probs]
      [0.625, 0.375]
    """
    validation.state_last("explain(logits, state)", logits, state)
    inputs = dict(inputs, mask=mask)
    if run.outside_jit(self, (logits, state, inputs)):  # compiled once, as pick is: op by op it takes seconds
      return run.compiled_call(self, explain.views, logits, state, inputs, top=top)
    return explain.views(self, logits, state, inputs, top)
