"""The stage contract: the settings a stage owns, and its action on candidates and on a row.

A stage acts once per draw, on one of two paths of :meth:`Sampler.pick`:

- ``on_candidates`` works on :class:`Candidates`, the ``K`` best tokens of the
  row after the one ``O(V)`` cut, like llama.cpp's token data array;
- ``on_row`` works on the full ``[V]`` row (the fallback, exact for any
  setting) and must never sort it. Its ``O(V)`` work sits behind a
  ``lax.cond`` on the settings, with the row passed through as the *false*
  branch: XLA's CPU backend copies a row that the true branch returns
  unchanged (a pass over ``V`` for nothing), but not one from the false branch.

Both see one row at a time (the sampler maps them over the batch) and must
remove the same tokens and leave the same logits, so that both paths draw the
same token. Removed tokens carry ``-inf``. Besides its settings, a stage may
declare:

- ``touches``: the ids whose logits it may change *before* the cut (penalties:
  the window's tokens; logit bias: the biased ids). The cut then keeps those
  ids beside the ``K`` best, so any change to them, up or down, stays exact;
  a stage that declares ``lowers`` only ever lowers them (DRY), and its ids
  need not join the cut: a lowered token outside it cannot rise into it;
- ``row_statistic``: a statistic of the row as the cut gives it (temperature:
  the log-normaliser of the tempered row), computed in a batched pass over
  ``V`` when some row needs it and passed in as ``Context.row_statistic``;
- ``init_state`` and ``update``: per-row state of its own (mirostat's ``mu``),
  kept in ``SamplerState.stages[name]`` and updated after every draw and by
  :meth:`Sampler.accept`;
- ``inputs``: per-call inputs it reads (``pick(..., name=array)``), seen per
  row as ``Context.inputs[name]``.

:func:`elementwise` builds both actions of a stage from one elementwise rule.
"""

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import noise
from jsample._src.kernels.rowmath import logsumexp

Settings = dict[str, jax.Array]
"""One row's setting values, by name (scalars ``[]`` or short vectors ``[N]``)."""


def window_slot(position: jax.Array, width: int) -> jax.Array:
  """The window slot of the token at ``position`` (any int, negative included): ``position % width``."""
  # A power-of-two width (the default 64) wraps with a mask: fewer operations than a signed remainder.
  return position & (width - 1) if width & (width - 1) == 0 else jnp.mod(position, max(width, 1))


class Setting(NamedTuple):
  """A per-row setting that a stage reads from the sampler state.

  Attributes:
    name: the keyword users pass to ``init`` (``"top_p"``).
    default: the value rows get unless ``init`` says otherwise.
    dtype: ``jnp.float32``, ``jnp.int32`` or ``jnp.bool_``.
    valid: predicate over values, False marks a bad one. The same predicate
      checks concrete values in ``init`` and traced ones in
      :meth:`Sampler.checked` mode, so write it with operators and ``jnp``.
    allowed: the allowed range in words, for error messages.
    neutral: the value that makes the stage neutral, the identity (None: no single such value).
    help: one line for ``--help`` texts and docs.
    shape: one row's shape: ``()`` for a scalar, ``(N,)`` for a short vector
      (logit-bias ids, say); ``init`` takes ``[N]`` for every row or ``[B, N]``.
    at_most: the name of a static size of the sampler that bounds the value
      (``"window_size"`` for ``penalty_last_n``), or None.

  Examples:
    >>> import jax.numpy as jnp
    >>> floor = Setting("floor", 0.0, jnp.float32, lambda v: (v >= 0) & (v < 1), "in [0, 1)", 0.0, "a floor")
    >>> bool(floor.valid(0.5)), bool(floor.valid(1.5))
    (True, False)
  """

  name: str
  default: Any
  dtype: Any
  valid: Callable[[Any], Any]
  allowed: str
  neutral: Any = None
  help: str = ""
  shape: tuple[int, ...] = ()
  at_most: str | None = None


class Context(NamedTuple):
  """What a stage may read besides its settings, for one row.

  Attributes:
    window: ``[W]`` int32 ring buffer of recent token ids, ``-1`` for empty.
    position: ``[]`` int32 tokens accepted so far; the newest sits at
      ``window[(position - 1) % W]``.
    vocab: ``V``, the size of the vocabulary (static).
    offset: the token id of the row's first entry: ``on_row`` sees tokens
      ``offset .. offset + width - 1`` (0 unless the vocabulary is sharded).
    step_bits: ``[2]`` uint32, the row's step bits (``fold_in(key, position)``);
      use :meth:`uniform` for a stage's own randomness.
    inputs: the per-call inputs the stage declared, for this row.
    state: the stage's own state for this row (None without ``init_state``).
    row_statistic: ``[]`` float32, the stage's row statistic (on candidates), NaN
      where it is not computed (before the row's statistics are, or the stage
      declared none; a stage then treats it as unknown). It describes the row
      as the cut gave it, so it holds for the row the stage sees only where
      ``Candidates.log_z_known`` does; only the first stage that declares a
      statistic gets one.
    branch_free: whether the strategy in use wants no data-dependent loops
      or conditionals (the accelerator strategy); a stage with a cheap loop
      on a CPU (DRY's repeat lengths) picks its fixed, vectorised form then.

  Examples:
    >>> import jax.numpy as jnp
    >>> ctx = Context(window=jnp.array([5, -1], jnp.int32), position=jnp.int32(1), vocab=8, offset=4)
    >>> ctx.ids(3).tolist()  # a shard of the vocabulary that starts at id 4
    [4, 5, 6]
  """

  window: jax.Array
  position: jax.Array
  vocab: int
  offset: Any = 0
  step_bits: Any = None
  inputs: dict[str, jax.Array] = {}
  state: Any = None
  row_statistic: Any = float("nan")
  branch_free: bool = False

  def ids(self, width: int) -> jax.Array:
    """``[width]`` int32 token ids of a row of that width."""
    return self.offset + jnp.arange(width, dtype=jnp.int32)

  def ages(self) -> jax.Array:
    """``[W]`` int32: how many tokens before the last one each window slot's token came (0: the last one);
    read the other way, the slot of the token of each age ``0 .. W - 1``."""
    (width,) = self.window.shape
    return window_slot(self.position - 1 - jnp.arange(width, dtype=jnp.int32), width)

  def uniform(self, salt: int) -> jax.Array:
    """A uniform in ``[0, 1)`` from the row's own stream, one per ``salt`` and step.

    Stages that need a coin (XTC) use their own salt, so that their coin never
    repeats the noise of the draw.
    """
    return noise.uniform(self.step_bits, jnp.asarray([-1 - salt], jnp.int32))[0]


class Candidates(NamedTuple):
  """The ``K`` best tokens of one row, in sampling order.

  Sampling order is logit descending, then id ascending. Every stage after the
  cut keeps it (it removes tokens or applies a monotone map); tokens outside
  the candidates always rank below every surviving candidate.

  Attributes:
    ids: ``[K]`` int32 token ids (``V`` for an empty slot).
    logits: ``[K]`` float32, ``-inf`` for removed tokens.
    log_z: ``[]`` ``log Σ exp(logit)`` over every surviving token of the row as
      this stage sees it, candidate or not; meaningful where ``log_z_known``.
    log_z_known: ``[]`` bool: False before the row's statistics are computed,
      and after a stage changed tokens outside the candidates.
    covers_row: ``[]`` bool, True when no token outside the candidates survives.
    decided: ``[]`` bool, False when a stage could not decide from candidates;
      the row then takes the full-vocabulary path.

  Examples:
    >>> import jax.numpy as jnp
    >>> yes, no = jnp.bool_(True), jnp.bool_(False)
    >>> c = Candidates(jnp.array([2, 0, 1]), jnp.array([3.0, 1.0, 0.5]), jnp.float32(0), no, yes, yes)
    >>> c.keep(c.logits > 0.9).logits.tolist()
    [3.0, 1.0, -inf]
    >>> [round(float(v), 4) for v in c.log_normaliser()]  # covers_row: from the candidates themselves
    [3.1967, 1.0]
  """

  ids: jax.Array
  logits: jax.Array
  log_z: jax.Array
  log_z_known: jax.Array
  covers_row: jax.Array
  decided: jax.Array

  def log_normaliser(self) -> tuple[jax.Array, jax.Array]:
    """``(log Σ exp over all survivors, whether it is known)``: from the candidates when they cover the row."""
    known = self.covers_row | self.log_z_known
    return jnp.where(self.covers_row, logsumexp(self.logits), self.log_z), known

  def keep(self, keep: jax.Array) -> "Candidates":
    """Removes the candidates where ``keep`` is False."""
    return self._replace(logits=jnp.where(keep, self.logits, -jnp.inf))


class OnCandidates(Protocol):
  """A stage's action on one row's candidates."""

  def __call__(self, c: Candidates, s: Settings, ctx: Context, /) -> Candidates: ...


class OnRow(Protocol):
  """A stage's action on one full row ``[V]``; it must not sort."""

  def __call__(self, logits: jax.Array, s: Settings, ctx: Context, /) -> jax.Array: ...


class Stage(NamedTuple):
  """One step of a sampling chain; see the module docstring.

  Attributes:
    name: a short label (``"top_p"``); stages with state need distinct names.
    settings: the :class:`Setting` s this stage reads. Stages that declare a
      setting alike (same name, dtype, default, ``valid``, ...) share it: the
      state holds one value per row (llama.cpp's one ``min_keep``).
    on_candidates: ``(Candidates, settings, Context) -> Candidates``.
    on_row: ``(logits [V], settings, Context) -> logits [V]``.
    touches: ``(settings, Context) -> ids [E]``, the ids (``-1``: none) whose
      logits the stage may change; such a stage acts before the cut, and
      ``on_candidates`` sees those ids beside the best ``K``, not in order.
      It runs once per call, before the row's log-normaliser is known: it
      must not read ``Candidates.log_z``, and may only clear ``log_z_known``.
    lowers: ``(settings, Context) -> bool``, optional beside ``touches``: True
      where the stage never raises a logit it touches (penalties with
      weights that only penalise); where every row says so, the CPU cut
      skips the touched ids beyond the raw best.
    only_best: ``(settings) -> bool``, optional: True where the stage keeps
      only the best token it is given (temperature 0, top-k 1).
    argmax_invariant: ``(settings) -> bool``, optional: True where the stage
      keeps the best token it is given and lifts no other above it (a
      truncation, a temperature; vLLM's term). Where one stage keeps only the
      best and every stage after the cut is argmax-invariant, the row's token
      is the best of the cut, and a batch of such rows takes one argmax-like
      pass (no stage missing this is assumed to be argmax-invariant).
    row_statistic: ``(row [V], settings, Context) -> []``, a statistic of
      the cleaned row as the cut gives it, passed to ``on_candidates`` as
      ``Context.row_statistic``.
    init_state: ``() -> pytree``, one row's initial state.
    update: ``(state, token, logprob, settings, Context) -> state``, after a
      draw (``logprob`` of the token under the final distribution, NaN when
      :meth:`Sampler.accept` appended it).
    inputs: names of the per-call inputs the stage reads.
    is_neutral: ``(settings) -> bool``, optional: True where ``on_candidates``
      is the identity (logits and flags alike), as for a neutral setting. Where
      every row of a batch says so, the CPU strategy skips the stage (one
      ``lax.cond``), so a stage left neutral costs nothing. A stage with
      ``touches`` needs none: touching no id (``-1``), it changes nothing.

  Examples:
    >>> import jsample
    >>> stage = jsample.top_k(40)
    >>> stage.name, [setting.name for setting in stage.settings], stage.touches is None
    ('top_k', ['top_k'], True)

    The README's "Design" section builds a complete stage of one's own.
  """

  name: str
  settings: tuple[Setting, ...]
  on_candidates: OnCandidates
  on_row: OnRow
  touches: Callable[[Settings, Context], jax.Array] | None = None
  lowers: Callable[[Settings, Context], jax.Array] | None = None
  only_best: Callable[[Settings], jax.Array] | None = None
  argmax_invariant: Callable[[Settings], jax.Array] | None = None
  row_statistic: Callable[[jax.Array, Settings, Context], jax.Array] | None = None
  init_state: Callable[[], Any] | None = None
  update: Callable[..., Any] | None = None
  inputs: tuple[str, ...] = ()
  is_neutral: Callable[[Settings], jax.Array] | None = None


def elementwise(
  name: str,
  settings: tuple[Setting, ...],
  rule: Callable[[jax.Array, jax.Array, jax.Array, Settings, Context], jax.Array],
  *,
  is_neutral: Callable[[Settings], jax.Array] | None = None,
  covers_row: Callable[[Candidates, Candidates, Settings], jax.Array] | None = None,
  argmax_invariant: Callable[[Settings], jax.Array] | None = None,
) -> Stage:
  """A stage from one elementwise rule, applied alike to candidates and to a row.

  Args:
    name: the stage's name.
    settings: its settings.
    rule: ``(logits, ids, best, settings, ctx) -> logits``, elementwise over
      ``logits`` and their token ``ids``; ``best`` is the row's highest logit.
      It may remove tokens (``-inf``) and lower or raise logits, but must keep
      the order of any two tokens it keeps (a monotone map, or removal), so
      that tokens outside the candidates stay below them.
    is_neutral: optional ``settings -> bool``, True where the rule is the
      identity (the full path then skips its pass over the row).
    covers_row: optional ``(before, after, settings) -> bool``: True where no
      token outside the candidates survives the rule, so that the candidates
      cover the row (min-p's threshold above the last candidate, say).
    argmax_invariant: optional ``settings -> bool``, True where the rule keeps
      the best token (see :attr:`Stage.argmax_invariant`).

  Returns:
    A :class:`Stage`. Where the rule changed something and the candidates do
    not cover the row, the row's log-normaliser becomes unknown.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> floor = jsample.Setting("floor", -1.0, jnp.float32, jnp.isfinite, "finite", neutral=-jnp.inf)
    >>> cut_below = jsample.elementwise(
    ...   "floor", (floor,), lambda x, ids, best, s, ctx: jnp.where(x >= s["floor"], x, -jnp.inf))
    >>> sampler = jsample.chain(cut_below, jsample.temperature(1.0))
    >>> p = sampler.probs(jnp.array([0.0, -2.0, 1.0]), sampler.init(seed=0))
    >>> [round(float(v), 3) for v in p]
    [0.269, 0.0, 0.731]
  """

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    alive = c.logits > -jnp.inf
    best = jnp.max(c.logits)
    after = c._replace(logits=jnp.where(alive, rule(c.logits, c.ids, best, s, ctx), -jnp.inf))
    identity = jnp.bool_(False) if is_neutral is None else is_neutral(s)
    covers = c.covers_row | (jnp.bool_(False) if covers_row is None else covers_row(c, after, s))
    # A rule that emptied the candidates says nothing of the tokens beyond them.
    emptied = ~jnp.any(after.logits > -jnp.inf) & jnp.any(alive) & ~covers
    return after._replace(
      logits=jnp.where(identity, c.logits, after.logits),
      log_z_known=c.log_z_known & identity,
      covers_row=jnp.where(identity, c.covers_row, covers),
      decided=c.decided & (identity | ~emptied),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    def apply():
      alive = logits > -jnp.inf
      return jnp.where(alive, rule(logits, ctx.ids(logits.shape[0]), jnp.max(logits), s, ctx), -jnp.inf)

    return apply() if is_neutral is None else lax.cond(~is_neutral(s), apply, lambda: logits)

  return Stage(name, settings, on_candidates, on_row, argmax_invariant=argmax_invariant, is_neutral=is_neutral)


def survivor_rank(logits: jax.Array) -> jax.Array:
  """1-based rank of each candidate among the survivors, in sampling order."""
  return jnp.cumsum((logits > -jnp.inf).astype(jnp.int32))


def sort_candidates(ids: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Sorts ``(ids, logits)`` into sampling order: logit descending, id ascending."""
  neg, ids = jax.lax.sort((-logits, ids), num_keys=2)
  return ids, -neg


def always_valid(value: Any) -> Any:
  """A :attr:`Setting.valid` for settings where every value means something."""
  return jnp.ones(jnp.shape(value), bool)
