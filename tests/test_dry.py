"""DRY against a literal float64/float32 NumPy transcription of llama.cpp's ``llama_sampler_dry_apply``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from jsample._src.stages import dry as dry_module

F32 = np.float32


def dry_reference(x, s, window):
  """llama.cpp's DRY, step by step; ``window`` oldest first, breakers a ``[N, L]`` -1-padded array."""
  x = np.asarray(x, np.float64)
  mult, base = F32(s["dry_multiplier"]), F32(s["dry_base"])
  allowed, last_n = int(s["dry_allowed_length"]), int(s["dry_penalty_last_n"])
  if mult == 0 or base < 1 or last_n == 0:
    return x
  window = list(window)
  n = len(window) if last_n < 0 else min(last_n, len(window))
  if n <= allowed:
    return x

  def rat(i):
    return window[len(window) - 1 - i]

  breakers = [
    [int(t) for t in row if t >= 0]
    for row in np.asarray(s["dry_sequence_breakers"]).reshape(-1, np.shape(s["dry_sequence_breakers"])[-1])
  ]
  breakers = [b for b in breakers if b]
  rep_limit = n
  for i in range(n):
    longest = -1
    for b in breakers:
      head, tail = b[0], b[1:]
      if head == rat(i) and len(tail) > longest and len(tail) <= i:
        if all(tail[o] == rat(i - o - 1) for o in range(len(tail))):
          longest = len(tail)
    if longest >= 0:
      rep_limit = i - longest
      break
  if rep_limit < allowed:
    return x
  maxrep = {}
  for k in range(1, n):
    length = 0
    while length + k < n and rat(length) == rat(length + k):
      length += 1
    length = min(length, rep_limit)
    if length >= allowed:
      token = rat(k - 1)
      maxrep[token] = max(maxrep.get(token, length), length)
  singles = {b[0] for b in breakers if len(b) == 1}
  top = int(F32(88.7228391) / np.log(base, dtype=F32)) if base > F32(1.000001) else 0
  y = x.astype(F32)
  with np.errstate(over="ignore", invalid="ignore"):
    for token, length in maxrep.items():
      if token in singles or not 0 <= token < x.size:
        continue
      e = length - allowed
      if top > 0 and e > top:
        e = top
      penalty = F32(np.float64(mult) * np.float64(base) ** e)
      y[token] = F32(y[token] - penalty)
  y = np.where(np.isnan(y), -np.inf, y).astype(np.float64)
  return np.where(x > -np.inf, y, -np.inf)


def _breakers(*rows, shape=(4, 3)):
  table = np.full(shape, -1, np.int32)
  for i, row in enumerate(rows):
    table[i, : len(row)] = row
  return table


def test_dry_conforms():
  settings = [
    dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1),
    dict(dry_multiplier=1.3, dry_base=2.0, dry_allowed_length=1, dry_penalty_last_n=6),
    dict(dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1),
    dict(dry_multiplier=0.5, dry_base=1.1, dry_allowed_length=0, dry_penalty_last_n=-1),
    dict(dry_multiplier=2.0, dry_base=0.9, dry_allowed_length=0, dry_penalty_last_n=-1),  # base < 1: off
  ]
  stage = jsample.dry(max_breakers=4, max_breaker_length=3)
  for i, row in enumerate(settings):
    # Per-row breakers: none, or single ids and a two-token sequence drawn from the rows' best tokens.
    row["dry_sequence_breakers"] = _breakers() if i % 2 else _breakers([5], [17, 3], [42])
  jsample.testing.assert_stage_conforms(stage, dry_reference, settings, window_size=12)


@functools.cache
def _compiled(window_size: int, budget: int, strategy: str):
  """DRY alone and DRY before a top-k, with their compiled probes: one program serves every probe of a window
  size, since the settings (breakers included) are state values. DRY's program is slow to compile."""
  alone = jsample.chain(
    jsample.dry(), jsample.temperature(1.0), window_size=window_size, budget=budget, strategy=strategy
  )
  cut = jsample.chain(jsample.dry(), jsample.top_k(8), window_size=window_size, budget=budget, strategy=strategy)
  probs = jax.jit(lambda x, state: (alone.probs(x, state), jsample.testing.full_path_probs(alone, x, state)))
  tokens = jax.jit(
    lambda xs, state: (
      jsample.testing.settled_on_candidates(cut, xs, state),
      cut.pick(xs, state)[0],
      jsample.testing.full_path_tokens(cut, xs, state),
    )
  )
  return alone, probs, cut, tokens


def _probe(window, settings, vocab=64, budget=16, seed=0):
  """Final logits of DRY alone on a row of zeros, both paths and both strategies, against the reference.

  Windows of up to 12 tokens share one window size (a prompt shorter than it leaves the rest empty)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(0, 0.5, vocab).astype(np.float32)
  x[np.asarray(window)] += 3.0  # the window's tokens among the best, so the cut must see DRY act
  want = jsample.testing.reference_probs(dry_reference, x, settings, list(window))
  for strategy in jsample.testing.STRATEGIES:
    alone, probs_of, cut, tokens_of = _compiled(max(12, len(window)), budget, strategy)
    probs, full = probs_of(jnp.asarray(x), alone.init(seed=1, prompt=list(window), **settings))
    np.testing.assert_allclose(probs, want, atol=1e-6, err_msg=strategy)
    np.testing.assert_allclose(full, want, atol=1e-6, err_msg=strategy)
    # With a truncation the candidates decide: lowering keeps the cut exact, the same token as the full path.
    state = cut.init(seed=np.arange(6), prompt=list(window), **settings)
    settled, tokens, full_tokens = tokens_of(jnp.asarray(np.tile(x, (6, 1))), state)
    assert bool(jnp.all(settled)), strategy
    np.testing.assert_array_equal(tokens, full_tokens, err_msg=strategy)
  return want, x


BASE = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1)


def test_the_llama_cpp_comment_example():
  """llama.cpp's own example: "a b c c b c y a b c" penalises c (3 -> 4), y (2 -> 3); b (1 -> 2) is below allowed 2."""
  a, b, c, y = 10, 11, 12, 13
  window = [a, b, c, c, b, c, y, a, b, c]
  want, x = _probe(window, dict(BASE, dry_sequence_breakers=np.full((8, 4), -1)))
  p0 = np.exp(x - x.max())
  ratio = (want / want[20]) / (p0 / p0[20])  # token 20: untouched
  np.testing.assert_allclose(ratio[[c, y, b, a]], np.exp(-np.array([0.8 * 1.75, 0.8, 0.0, 0.0])), rtol=1e-5)


def test_breakers_cut_the_repeat_and_are_never_penalised():
  # "1 2 3 4 | 1 2 3": the repeat "1 2 3" (3 tokens) would be extended by 4, unless a breaker sits inside it.
  window = [1, 2, 3, 4, 7, 1, 2, 3]
  free = _probe(window, dict(BASE, dry_sequence_breakers=np.full((8, 4), -1)))[0]
  cut = _probe(window, dict(BASE, dry_sequence_breakers=_breakers([2], shape=(8, 4))))[0]  # breaker 2: limit 1
  two = _probe(window, dict(BASE, dry_sequence_breakers=_breakers([1, 2], shape=(8, 4))))[0]  # "1 2": limit 1
  assert free[4] < cut[4] and free[4] < two[4]
  # A single-token breaker is never penalised, a multi-token head may be.
  loop = [5, 6, 5, 6, 5, 6, 5]
  single = _probe(loop, dict(BASE, dry_sequence_breakers=_breakers([6], shape=(8, 4))))[0]
  head = _probe(loop, dict(BASE, dry_sequence_breakers=_breakers([6, 9], shape=(8, 4))))[0]
  assert single[6] > head[6]


def test_long_repeats_clamp_the_exponent_and_can_remove_a_token():
  loop = list(range(3)) * 40  # a repeat of 117 tokens: base 3 clamps e at 80, a penalty of 1.5e38
  settings = dict(BASE, dry_base=3.0, dry_sequence_breakers=np.full((8, 4), -1))
  want, _ = _probe(loop, settings, vocab=64)
  assert want[0] == 0.0
  huge = dict(settings, dry_multiplier=5.0)  # 5 * 3^80 passes the largest float: the logit is -inf
  assert np.isneginf(dry_reference(np.zeros(64), huge, loop)[0])
  _probe(loop, huge, vocab=64)


def test_penalty_last_n_limits_the_view():
  window = [1, 2, 3, 4, 8, 9, 1, 2, 3]
  far = _probe(window, dict(BASE, dry_penalty_last_n=5, dry_sequence_breakers=np.full((8, 4), -1)))[0]
  near = _probe(window, dict(BASE, dry_penalty_last_n=9, dry_sequence_breakers=np.full((8, 4), -1)))[0]
  assert far[4] > near[4]


@pytest.mark.parametrize("bits", [31, 6])  # 6: only the bits e can have (what a window of 32 to 63 tokens asks)
def test_the_penalty_is_llama_cpps_double_rounded_once(bits):
  rng = np.random.default_rng(0)
  mult = rng.uniform(0, 3, 4000).astype(F32)
  base = rng.uniform(1, 3, 4000).astype(F32)
  e = rng.integers(0, 60, 4000).astype(np.int32)
  power = jax.jit(functools.partial(dry_module._scaled_power, bits=bits))
  got = np.asarray(power(jnp.asarray(mult), jnp.asarray(base), jnp.asarray(e)))
  want = (mult.astype(np.float64) * base.astype(np.float64) ** e).astype(F32)
  ok = np.isfinite(want)
  np.testing.assert_array_equal(got[ok], want[ok])


@pytest.mark.parametrize("width", [1, 2, 7, 40, 300])
def test_both_repeat_length_forms_are_the_z_array(width):
  rng = np.random.default_rng(width)
  rows = [rng.integers(0, 3, width) for _ in range(4)]  # short repeats everywhere
  rows += [np.resize(rng.integers(0, 9, p), width) for p in (1, 2, 5, 13)]  # loops, as DRY meets them
  rows += [np.where(rng.random(width) < 0.9, 7, rng.integers(0, 3, width))]  # one token nearly everywhere
  x = np.asarray(rows, np.int32)
  want = [[next((j for j in range(width - k) if r[j] != r[j + k]), width - k) for k in range(width)] for r in x]
  want = np.asarray(want, np.int32).reshape(x.shape)[:, 1:]
  for z in (dry_module._z_loop, dry_module._z_vectorised):
    for row, expected in zip(x, want, strict=True):
      np.testing.assert_array_equal(np.asarray(z(jnp.asarray(row)))[1:], expected)
    # The rows at once: the loop's own batching rule, every row ending when it is done.
    np.testing.assert_array_equal(np.asarray(jax.vmap(z)(jnp.asarray(x)))[:, 1:], want)


def test_double_float_squaring_survives_fma_contraction():
  """In a loop body XLA's CPU backend contracts ``x * y + z`` into an FMA: squaring there must still carry about
  48 bits (Dekker's ``a * b - p`` lost its error term to it, leaving a float32's 24)."""
  rng = np.random.default_rng(3)
  base = rng.uniform(1, 1.5, 10_000).astype(F32)

  def square(_, pair):
    return dry_module._times(*pair, *pair)

  hi, lo = jax.jit(lambda b: jax.lax.fori_loop(0, 5, square, (b, jnp.zeros_like(b))))(jnp.asarray(base))
  got = np.asarray(hi, np.float64) + np.asarray(lo, np.float64)
  exact = base.astype(np.float64) ** 32
  assert np.max(np.abs(got - exact) / exact) < 2.0**-40
