"""A conformance suite for stages: what every stage, built in or yours, must do.

:func:`assert_stage_conforms` runs a stage through everything the sampler
promises, against a float64 reference function of your own:

- ``vmap`` over rows (each with its own state) equals a loop over them;
- the state keeps its shapes and dtypes through ``lax.scan`` and ``lax.cond``;
- new setting values never recompile;
- neutral settings are the identity;
- float32, bfloat16 and float16 rows all agree with the reference;
- the candidate path and the full-vocabulary path give the same distribution
  and the same token, on both strategies (``"cpu"`` and ``"accelerator"``);
- the distribution agrees with the reference, and seeded draws follow it
  (chi-square).

It needs jax and numpy only, so a stage written outside the library can be
checked in its own test suite. :func:`full_path_probs`, :func:`full_path_tokens` and
:func:`settled_on_candidates` expose the two paths for tests of your own; called
outside ``jit``, each compiles once per sampler and shapes, as the sampler's own
methods do.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jsample._src import draw, paths, run
from jsample._src.recipes import chain
from jsample._src.sampler import Sampler
from jsample._src.stage import Stage
from jsample._src.stages.temperature import temperature

Reference = Callable[[np.ndarray, dict[str, Any], list[int]], np.ndarray]
"""``(row [V] float64, one row's settings, window oldest first) -> final logits [V] float64``."""

STRATEGIES = ("cpu", "accelerator")


def full_path_probs(sampler: Sampler, logits, state, mask=None, **inputs) -> jax.Array:
  """The distribution of the full-vocabulary path alone, ``[B, V]``, whatever the candidates decide.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
    >>> probs = full_path_probs(sampler, jnp.log(jnp.array([[0.2, 0.5, 0.3]])), sampler.init(seed=[0]))
    >>> [round(float(p), 3) for p in probs[0]]
    [0.0, 0.625, 0.375]
  """
  return _compiled_outside_jit(_full_path_probs, sampler, logits, state, dict(inputs, mask=mask))


def _full_path_probs(sampler: Sampler, logits, state, inputs: dict) -> jax.Array:
  (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, inputs)

  def one(raw, mask, row):
    return draw.softmax(paths.full_path(sampler.stages, raw, mask, row, strategy))

  out = jax.vmap(one)(raw, mask, rows)
  return out[0] if single else out


def full_path_tokens(sampler: Sampler, logits, state, mask=None, **inputs) -> jax.Array:
  """The tokens the full-vocabulary path alone draws, ``[B]``, with the rows' own streams.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
    >>> logits, state = jnp.log(jnp.array([[0.2, 0.5, 0.3]])), sampler.init(seed=[0])
    >>> bool(full_path_tokens(sampler, logits, state)[0] == sampler.pick(logits, state)[0][0])
    True
  """
  return _compiled_outside_jit(_full_path_tokens, sampler, logits, state, dict(inputs, mask=mask))


def _full_path_tokens(sampler: Sampler, logits, state, inputs: dict) -> jax.Array:
  (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, inputs)

  def one(raw, mask, row):
    final = paths.full_path(sampler.stages, raw, mask, row, strategy)
    return draw.on_row(final, row.step_bits, strategy.race_row, logprob=False).token

  out = jax.vmap(one)(raw, mask, rows)
  return out[0] if single else out


def candidate_path(sampler: Sampler, logits, state, mask=None, *, statistics: bool = True, **inputs):
  """The candidate path alone: ``(Draw [B], settled [B])``.

  With ``statistics=False`` it stops before the row statistics, as a call does
  when the candidates decide every row without them.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(0.0), budget=2)
    >>> drawn, settled = candidate_path(sampler, jnp.array([[0.1, 3.0, 2.0]]), sampler.init(seed=[0]))
    >>> drawn.token.tolist(), settled.tolist()
    ([1], [True])
  """
  inputs = dict(inputs, mask=mask)
  return _compiled_outside_jit(_candidate_path, sampler, logits, state, inputs, statistics=statistics)


def _candidate_path(sampler: Sampler, logits, state, inputs: dict, *, statistics: bool):
  (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, inputs)
  path = paths.candidates(sampler.stages, sampler.budget, raw, mask, rows, strategy)
  cands, ok = path.settle() if statistics else path.first()
  drawn = jax.vmap(draw.on_candidates)(cands.logits, cands.ids, rows.step_bits)
  return jax.tree.map(lambda a: a[0], (drawn, ok)) if single else (drawn, ok)


def settled_on_candidates(sampler: Sampler, logits, state, mask=None, **inputs) -> jax.Array:
  """``[B]`` bool: which rows the candidate path settles (its candidates are decided and cover the row; the others
  take the full path).

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_p(0.99), budget=2)  # a nucleus wider than 2 candidates
    >>> flat, peaked = jnp.zeros(8), jnp.array([9.0, 8.0] + [0.0] * 6)
    >>> settled_on_candidates(sampler, jnp.stack([flat, peaked]), sampler.init(seed=[0, 1])).tolist()
    [False, True]
  """
  return _compiled_outside_jit(_settled_on_candidates, sampler, logits, state, dict(inputs, mask=mask))


def _settled_on_candidates(sampler: Sampler, logits, state, inputs: dict) -> jax.Array:
  (raw, mask), rows, single, strategy = run.prepare(sampler, logits, state, inputs)
  _, ok = paths.candidates(sampler.stages, sampler.budget, raw, mask, rows, strategy).settle()
  return ok[0] if single else ok


def _compiled_outside_jit(function, sampler: Sampler, logits, state, inputs: dict, **static):
  """``function(sampler, logits, state, inputs, **static)``; called on concrete arrays, compiled once per
  sampler, function and shapes, as the sampler's own methods are: run op by op, a call of llama_cpp()'s chain
  takes seconds, each of its conditionals compiled afresh."""
  if run.outside_jit(sampler, (logits, state, inputs)):
    return run.compiled_call(sampler, function, logits, state, inputs, **static)
  return function(sampler, logits, state, inputs, **static)


def reference_probs(reference: Reference, x: np.ndarray, settings: dict, window: list[int]) -> np.ndarray:
  """The reference's distribution over one row: softmax of its final logits, in float64.

  ``reference(x, settings, window)`` gives the row's final logits, ``-inf`` for removed tokens.

  Examples:
    >>> import numpy as np
    >>> def top_1(x, settings, window):
    ...   return np.where(x == x.max(), x, -np.inf)
    >>> reference_probs(top_1, np.array([0.0, 2.0, 1.0]), {}, []).tolist()
    [0.0, 1.0, 0.0]
  """
  x = np.where(np.isnan(x), -np.inf, np.asarray(x, np.float64))
  y = np.asarray(reference(x, settings, window), np.float64)
  out = np.zeros(y.shape)
  alive = y > -np.inf
  if alive.any():
    e = np.exp(y[alive] - y[alive].max())
    out[alive] = e / e.sum()
  return out


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
  """The p-value of a chi-square goodness-of-fit test (Wilson-Hilferty; no SciPy needed).

  Cells with an expected count below 5 are pooled into one.

  Examples:
    >>> import numpy as np
    >>> probs = np.array([0.5, 0.3, 0.2])
    >>> chi_square_p(np.array([502, 297, 201]), probs) > 0.5, chi_square_p(np.array([700, 200, 100]), probs) < 1e-6
    (True, True)
  """
  n = counts.sum()
  expected = probs * n
  big = expected >= 5
  observed = np.append(counts[big], counts[~big].sum())
  expected = np.append(expected[big], expected[~big].sum())
  keep = expected > 0
  if np.any(observed[~keep] > 0):
    return 0.0  # a draw the reference gives no mass
  observed, expected = observed[keep], expected[keep]
  k = observed.size - 1
  if k < 1:
    return 1.0
  stat = float(np.sum((observed - expected) ** 2 / expected))
  z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
  return 0.5 * math.erfc(z / math.sqrt(2))


def _rows(rng: np.random.Generator, vocab: int, count: int) -> np.ndarray:
  kinds = []
  for i in range(count):
    kind = i % 4
    if kind == 0:
      x = rng.normal(0, rng.uniform(0.5, 3), vocab)
    elif kind == 1:  # Zipf-like, as language models give
      x = -rng.uniform(0.8, 1.5) * np.log1p(rng.permutation(vocab)) + rng.normal(0, 0.1, vocab)
    elif kind == 2:  # exact ties
      x = rng.integers(-3, 3, vocab).astype(np.float64)
    else:  # holes: -inf and NaN
      x = rng.normal(0, 2, vocab)
      x[rng.random(vocab) < 0.2] = -np.inf
      x[rng.random(vocab) < 0.05] = np.nan
    kinds.append(x)
  return np.stack(kinds).astype(np.float32)


def _prompts(rng: np.random.Generator, xs: np.ndarray, window: int) -> list[list[int]]:
  """Recent tokens, biased towards each row's best tokens so that window stages bite."""
  out = []
  for x in xs:
    best = np.argsort(-np.nan_to_num(x, nan=-np.inf), kind="stable")[: max(4, window // 2)]
    pool = np.concatenate([best, rng.integers(0, x.size, 4)])
    out.append([int(t) for t in rng.choice(pool, int(rng.integers(0, 2 * window)))])
  return out


def _per_row(settings: Sequence[dict], count: int) -> dict[str, np.ndarray]:
  rows = [dict(settings[i % len(settings)]) for i in range(count)]
  names = sorted({name for row in rows for name in row})
  return {name: np.array([row[name] for row in rows]) for name in names}


def _row_settings(sampler: Sampler, per_row: dict, i: int) -> dict:
  values = {name: s.default for name, s in sampler.settings.items()}
  values.update({name: v[i] for name, v in per_row.items()})
  return values


def assert_stage_conforms(
  stage: Stage,
  reference: Reference,
  settings: Sequence[dict],
  *,
  vocab: int = 300,
  rows: int = 8,
  window_size: int = 8,
  draws: int = 4000,
  atol: float = 2e-5,
  seed: int = 0,
) -> None:
  """Checks one stage against its float64 reference; raises ``AssertionError`` on the first failure.

  The stage runs in the chain ``(stage, temperature(1))`` (or alone if it owns
  ``temperature``), so the draw is the softmax of what it leaves.

  Args:
    stage: the stage under test.
    reference: ``(row [V] float64 with NaN as -inf, one row's settings (every
      setting of the chain, by name), window oldest first) -> final logits``.
    settings: per-row settings to try (each a dict of some of the stage's
      settings; rows cycle through them). Include neutral and extreme values.
    vocab: ``V`` of the test rows.
    rows: ``B``.
    window_size: ``W``.
    draws: seeded draws for the chi-square test (0 skips it).
    atol: tolerance on probabilities against the reference.
    seed: the NumPy seed of the rows and prompts.

  Examples:
    >>> import numpy as np, jsample, jsample.testing
    >>> def reference(x, s, window):
    ...   order = np.lexsort((np.arange(x.size), -x))
    ...   k = s["top_k"] if 0 < s["top_k"] < x.size else x.size
    ...   y = np.full(x.shape, -np.inf)
    ...   y[order[:k]] = x[order[:k]]
    ...   return y
    >>> jsample.testing.assert_stage_conforms(jsample.top_k(), reference, [dict(top_k=3), dict(top_k=0)], draws=0)
  """
  own = {s.name for s in stage.settings}
  stages = (stage,) if "temperature" in own else (stage, temperature(1.0))
  rng = np.random.default_rng(seed)
  xs = _rows(rng, vocab, rows)
  prompts = _prompts(rng, xs, window_size)
  per_row = _per_row(settings, rows)
  windows = [p[-window_size:] for p in prompts]

  def build(budget: int, strategy: str) -> Sampler:
    return chain(*stages, window_size=window_size, budget=budget, strategy=strategy)

  def fresh(sampler: Sampler, values=None):
    return sampler.init(seed=np.arange(rows) + 11, prompt=prompts, **(per_row if values is None else values))

  base = build(16, "cpu")
  expected = np.stack(
    [reference_probs(reference, xs[i], _row_settings(base, per_row, i), windows[i]) for i in range(rows)]
  )

  # -- against the reference, on both paths and both strategies ------------------
  # One program per strategy and budget (mostly the full path, then always the candidates), run below on
  # every state of the same shapes: compiling is most of a check's time, and new values never recompile.
  programs = {}
  traces = []  # of the ('cpu', 4) program, once per compilation
  for strategy in STRATEGIES:
    for budget in (4, vocab):
      sampler = build(budget, strategy)
      full = budget == 4  # the full path does not depend on the budget

      def every(x, state, sampler=sampler, full=full, counted=(strategy, budget) == ("cpu", 4)):
        if counted:
          traces.append(1)
        return sampler.probs(x, state), full_path_probs(sampler, x, state) if full else None, sampler.pick(x, state)

      programs[strategy, budget] = sampler, jax.jit(every)

  def run_all(values, want: np.ndarray, what: str):
    """Every program on the rows with per-row ``values`` (None: the ones under test): each distribution
    against ``want``, the tokens against each other."""
    picked = {}
    for (strategy, budget), (sampler, program) in programs.items():
      probs, full, picked[strategy, budget] = program(jnp.asarray(xs), fresh(sampler, values))
      _close(np.asarray(probs), want, atol, f"{stage.name}: probs ({strategy}, budget {budget}){what}")
      if full is not None:
        _close(np.asarray(full), want, atol, f"{stage.name}: the full path ({strategy}){what}")
    tokens = {key: np.asarray(value[0]) for key, value in picked.items()}
    for key, value in tokens.items():
      _equal(value, tokens["cpu", 4], f"{stage.name}: tokens of the two paths and strategies, {key} against ('cpu', 4)")

  run_all(None, expected, " against the reference")

  # -- vmap and a loop over rows equal the batched call ------------------------------
  sampler, program = programs["cpu", 4]
  state = fresh(sampler)
  jitted, after = program(jnp.asarray(xs), state)[2]
  vmapped = jax.jit(jax.vmap(sampler.pick))  # also draws the chi-square test's samples below, at these shapes
  mapped, _ = vmapped(jnp.asarray(xs), state)
  _equal(np.asarray(mapped), np.asarray(jitted), f"{stage.name}: vmap over rows and the batched call")
  single = jax.jit(sampler.pick)
  looped = [int(single(jnp.asarray(xs[i]), jax.tree.map(lambda a, i=i: a[i], state))[0]) for i in range(rows)]
  _equal(np.asarray(looped), np.asarray(jitted), f"{stage.name}: a loop over rows and the batched call")

  # -- the state through scan and cond; no recompile on new values -----------------
  shapes = jax.tree.map(lambda a: (a.shape, a.dtype), state)
  if jax.tree.map(lambda a: (a.shape, a.dtype), after) != shapes:
    raise AssertionError(f"{stage.name}: pick changed the state's shapes or dtypes")

  def steps(x, state):
    def body(state, go):  # a draw inside a cond inside a scan: one copy of pick in the program
      return jax.lax.cond(go, lambda s: sampler.pick(x, s)[1], lambda s: s, state), None

    return jax.lax.scan(body, state, jnp.array([True, True, False, True]))[0]

  # Tracing decides the state's shapes and dtypes (and scan and cond refuse a carry or branches that change
  # them), so the program is traced, not compiled: a compile would check nothing more.
  scanned = jax.eval_shape(steps, jnp.asarray(xs), state)
  if jax.tree.map(lambda a: (a.shape, a.dtype), scanned) != shapes:
    raise AssertionError(f"{stage.name}: the state changed shapes or dtypes through scan and cond")
  for values in settings:
    every_row = {k: np.broadcast_to(v, (rows,) + sampler.settings[k].shape) for k, v in values.items()}
    program(jnp.asarray(xs), sampler.configure(state, **every_row))
  if len(traces) != 1:
    raise AssertionError(f"{stage.name}: new setting values recompiled ({len(traces)} traces)")

  # -- neutral settings are the identity --------------------------------------------
  neutral = {s.name: s.neutral for s in stage.settings if s.neutral is not None}
  if neutral and len(neutral) == len(stage.settings):
    plain = np.stack([reference_probs(lambda x, s, w: x, xs[i], {}, []) for i in range(rows)])
    off = np.asarray(program(jnp.asarray(xs), fresh(sampler, neutral))[0])
    _close(off, plain, 1e-6, f"{stage.name}: neutral settings {neutral} are not the identity")

  # -- neutral in every row, the stage is skipped (Stage.is_neutral): the same as applied
  if stage.is_neutral is not None:
    for values in settings:
      every_row = _per_row([values], rows)
      if not bool(stage.is_neutral({k: jnp.asarray(v) for k, v in _row_settings(base, every_row, 0).items()})):
        continue
      want = np.stack(
        [reference_probs(reference, xs[i], _row_settings(base, every_row, i), windows[i]) for i in range(rows)]
      )
      run_all(every_row, want, f" with the stage neutral in every row ({values}) against the reference")

  # -- half-precision rows ------------------------------------------------------------
  for dtype in (jnp.bfloat16, jnp.float16):
    half = xs.astype(dtype)
    want = np.stack(
      [
        reference_probs(reference, half[i].astype(np.float32), _row_settings(base, per_row, i), windows[i])
        for i in range(rows)
      ]
    )
    got = np.asarray(jax.jit(sampler.probs)(jnp.asarray(half), state), np.float64)
    _close(got, want, atol, f"{stage.name}: {np.dtype(dtype).name} rows against the reference")

  # -- seeded draws follow the distribution ------------------------------------------
  if draws:
    row = int(np.argmax([np.sum(p > 1e-3) for p in expected]))  # the widest distribution
    # The row ``rows`` at a time through the vmapped program above (the same shapes: no new program), each copy
    # with its own key: ``draws`` seeded draws of that row.
    x = jnp.broadcast_to(jnp.asarray(xs[row]), xs.shape)
    copies = jax.tree.map(lambda a: jnp.broadcast_to(a[row], a.shape), state)
    batches = -(-draws // rows)
    keys = jax.vmap(jax.random.key)(jnp.arange(batches * rows, dtype=jnp.uint32) + 1000).reshape(batches, rows)
    picked = np.concatenate([np.asarray(vmapped(x, copies._replace(key=keys[i]))[0]) for i in range(batches)])
    counts = np.bincount(picked[:draws], minlength=vocab)
    p = chi_square_p(counts, expected[row])
    if p < 1e-4:
      raise AssertionError(f"{stage.name}: draws do not follow the distribution (chi-square p = {p:.2e})")


def _close(got: np.ndarray, want: np.ndarray, atol: float, what: str) -> None:
  if got.shape != want.shape or not np.allclose(got, want, atol=atol, rtol=0):
    worst = np.unravel_index(np.argmax(np.abs(got - want)), want.shape) if got.shape == want.shape else None
    raise AssertionError(f"{what}: largest difference at {worst}")


def _equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
  if not np.array_equal(got, want):
    raise AssertionError(f"{what}: differ in rows {np.nonzero(got != want)[0].tolist()}")
