"""The draw: its distribution (chi-square), its tail, and its reproducibility."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jsample
from jsample._src.kernels import noise
from tests import reference
from tests.helpers import (
  KINDS,
  NEUTRAL,
  NEUTRAL_PENALTIES,
  ROWS,
  VOCAB,
  WINDOW,
  batch,
  chi_square,
  full_path_tokens,
  llama_stages,
  row,
  shared,
)

DRAWS = 50_000

# (settings, candidate budget): each chi-square case below, on a 24-token row.
CASES = [
  (dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), 256),
  (dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0), 256),
  (dict(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0), 256),
  (dict(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0), 256),
  (dict(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0), 4),  # full-vocabulary path
  (dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1), 256),
  (dict(temperature=1.3, top_k=0, top_p=1.0, min_p=0.02), 3),  # full-vocabulary path
  (dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), 256),  # llama.cpp defaults
  (dict(temperature=1.0, top_k=10, top_p=0.9, min_p=0.05, repeat_penalty=1.5), 256),
  (dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, frequency_penalty=0.5, presence_penalty=0.3), 256),
  (dict(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=0.7), 256),  # raises: full path
  (dict(temperature=0.5, top_k=0, top_p=0.99, min_p=0.0), 8),
]
PROMPT = [3, 3, 0, 7, 1]


@functools.cache
def _llama_cpp_pick(budget: int, strategy: str):
  """llama.cpp's chain and its compiled ``pick``: the cases of one budget share the program (settings are state)."""
  sampler = jsample.llama_cpp(window_size=8, budget=budget, strategy=strategy)
  return sampler, jax.jit(sampler.pick)


@pytest.mark.slow
@pytest.mark.parametrize("settings, budget", CASES)
def test_draws_follow_the_reference_distribution(settings, budget, every_strategy):
  rng = np.random.default_rng(0)
  x = (rng.normal(0, 1.5, 24)).astype(np.float32)
  sampler, pick = _llama_cpp_pick(budget, every_strategy)
  state = sampler.init(seed=np.arange(DRAWS), prompt=PROMPT, **settings)
  tokens, _ = pick(jnp.broadcast_to(jnp.asarray(x), (DRAWS, x.size)), state)
  counts = np.bincount(np.asarray(tokens), minlength=x.size)
  stages = llama_stages({**NEUTRAL_PENALTIES, **settings})
  probs = reference.probabilities(x, stages, window=PROMPT)
  assert counts[probs == 0].sum() == 0, "drew a token the chain removed"
  assert chi_square(counts, probs) > 1e-4


@pytest.mark.slow
def test_draws_are_independent_across_positions():
  # One seed, many positions: the step key is fold_in(key, position).
  x = np.log(np.array([0.5, 0.3, 0.2], np.float32))
  sampler = jsample.chain(jsample.temperature(1.0), window_size=0)
  state = sampler.init(seed=11)

  def step(state, _):
    token, state = sampler.pick(jnp.asarray(x), state)
    return state, token

  _, tokens = jax.jit(lambda s: jax.lax.scan(step, s, length=DRAWS))(state)
  tokens = np.asarray(tokens)
  assert chi_square(np.bincount(tokens, minlength=3), np.exp(x.astype(np.float64))) > 1e-4
  pairs = np.bincount(tokens[:-1] * 3 + tokens[1:], minlength=9)
  assert chi_square(pairs, np.outer(np.exp(x), np.exp(x)).reshape(-1).astype(np.float64)) > 1e-4


@pytest.mark.slow
def test_tail_tokens_are_reachable():
  # A single float32 uniform could never draw a 1e-5 token beside a 1 - 1e-5
  # one at a rate this close to 1e-5; 56 bits of resolution can.
  tail, n = 1e-5, 2_000_000
  x = jnp.log(jnp.array([1 - tail, tail], jnp.float32))
  sampler = jsample.chain(jsample.temperature(1.0), window_size=0)
  tokens, _ = jax.jit(sampler.pick)(jnp.broadcast_to(x, (n, 2)), sampler.init(seed=np.arange(n)))
  hits = int(np.sum(np.asarray(tokens)))
  assert stats.poisson(tail * n).cdf(hits) > 1e-4 and stats.poisson(tail * n).sf(hits - 1) > 1e-4, hits


def test_uniforms_resolve_far_below_float32_epsilon():
  words = jnp.array([0x12345678, 0x9ABCDEF0], jnp.uint32)
  u = np.asarray(noise.uniform(words, jnp.arange(1 << 20, dtype=jnp.int32)), np.float64)
  assert u.min() >= 0 and u.max() < 1
  assert stats.kstest(u, "uniform").pvalue > 1e-4
  # Below float32's 2^-24 grid the low bits still count, down to 2^-56.
  lo = jnp.array([1 << 8, 2 << 8, 3 << 8, 0xFFFFFFFF], jnp.uint32)
  tiny = np.asarray(noise.unit_interval(jnp.zeros(4, jnp.uint32), lo), np.float64)
  np.testing.assert_array_equal(tiny[:3], np.array([1, 2, 3]) * 2.0**-56)
  assert 0 < tiny[3] < 2.0**-24
  assert np.asarray(noise.unit_interval(jnp.uint32(0xFFFFFFFF), jnp.uint32(0xFFFFFFFF))) < 1
  # so the Gumbel noise reaches far enough to let a 1e-12 survivor win
  assert float(-jnp.log(-jnp.log1p(-noise.unit_interval(jnp.uint32(0), jnp.uint32(1 << 8))))) > -np.log(1e-12) + 5


def test_greedy_takes_the_highest_logit_ties_to_the_lower_id():
  rng = np.random.default_rng(3)
  xs = np.stack([row(rng, VOCAB, KINDS[i % len(KINDS)]) for i in range(ROWS)])
  sampler, pick, _ = shared()
  tokens, _ = pick(jnp.asarray(xs), sampler.init(seed=np.arange(ROWS), temperature=0.0))
  expected = np.argmax(np.where(np.isnan(xs), -np.inf, xs), axis=1)  # first maximum: lowest id
  np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize(
  "vocab", [pytest.param(50, marks=pytest.mark.exhaustive), VOCAB, pytest.param(262144, marks=pytest.mark.exhaustive)]
)
def test_token_depends_on_row_settings_seed_and_position_only(vocab):
  size = ROWS if vocab < 262144 else 8
  xs, _, per_row, prompts = batch(vocab + 1, vocab, size)
  sampler, pick, _ = shared()
  state = sampler.init(seed=np.arange(size) * 7 + 1, prompt=prompts, **per_row)
  tokens, _ = pick(jnp.asarray(xs), state)
  tokens = np.asarray(tokens)
  if vocab <= 50:  # called outside jit: the program the sampler compiles and keeps for itself
    np.testing.assert_array_equal(sampler.pick(jnp.asarray(xs), state)[0], tokens)
  # any candidate budget, and the full-vocabulary path alone
  np.testing.assert_array_equal(shared(budget=1024).run(jnp.asarray(xs), state)[0], tokens)
  full = jax.jit(lambda x, s: full_path_tokens(sampler, x, s))(jnp.asarray(xs), state)
  np.testing.assert_array_equal(full, tokens)
  # alone, as one row; and in another slot of a reversed batch
  for i in range(0, size, max(1, size // 8)):
    row_state = jax.tree.map(lambda a, i=i: a[i], state)
    assert int(pick(jnp.asarray(xs[i]), row_state)[0]) == tokens[i]
  flipped = jax.tree.map(lambda a: a[::-1], state)
  np.testing.assert_array_equal(pick(jnp.asarray(xs[::-1]), flipped)[0], tokens[::-1])


def test_batch_size_and_padding_rows_do_not_matter():
  xs, _, per_row, prompts = batch(5, VOCAB, ROWS)
  sampler, pick, _ = shared()
  state = sampler.init(seed=np.arange(ROWS), prompt=prompts, **per_row)
  tokens = np.asarray(pick(jnp.asarray(xs), state)[0])
  # Pad to 4x the rows with empty (-inf) rows and other settings.
  pad = 3 * ROWS
  padded_x = np.concatenate([xs, np.full((pad, VOCAB), -np.inf, np.float32)])
  padded_state = jax.tree.map(lambda a: jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad, *a.shape[1:]))]), state)
  padded_state = padded_state._replace(
    settings={**padded_state.settings, "top_k": padded_state.settings["top_k"].at[ROWS:].set(0)}
  )
  got = np.asarray(pick(jnp.asarray(padded_x), padded_state)[0])
  np.testing.assert_array_equal(got[:ROWS], tokens)


def test_vmap_over_rows_equals_a_loop_and_the_batched_call():
  xs, _, per_row, prompts = batch(9, VOCAB, ROWS)
  sampler, pick, _ = shared()
  state = sampler.init(seed=np.arange(ROWS), prompt=prompts, **per_row)
  mapped, mapped_state = jax.jit(jax.vmap(sampler.pick))(jnp.asarray(xs), state)
  batched, batched_state = pick(jnp.asarray(xs), state)
  looped = [int(pick(jnp.asarray(xs[i]), jax.tree.map(lambda a, i=i: a[i], state))[0]) for i in range(ROWS)]
  np.testing.assert_array_equal(mapped, looped)
  np.testing.assert_array_equal(batched, looped)
  for a, b in zip(jax.tree.leaves(mapped_state), jax.tree.leaves(batched_state), strict=True):
    np.testing.assert_array_equal(
      jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a,
      jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key) else b,
    )


def test_changing_settings_never_recompiles():
  sampler, step, traces = shared()
  x = jnp.asarray(np.random.default_rng(0).normal(size=(ROWS, VOCAB)), jnp.float32)
  rng = np.random.default_rng(1)
  for i in range(20):
    state = sampler.init(
      seed=rng.integers(0, 1000, ROWS),
      temperature=rng.uniform(0, 2, ROWS),
      top_k=rng.integers(-1, 100, ROWS),
      top_p=rng.uniform(0.1, 1, ROWS),
      min_p=rng.uniform(0, 0.5, ROWS),
      repeat_penalty=rng.uniform(0.5, 2, ROWS),
      penalty_last_n=rng.integers(-1, WINDOW + 1, ROWS),
    )
    step(x, state)
    if i == 0:
      compiled = len(traces)  # the program at these shapes, traced now or by an earlier test
  assert len(traces) == compiled


def test_state_keeps_shape_and_dtype_through_scan_and_while_loop():
  sampler = jsample.gemma(window_size=8)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 64)), jnp.float32)
  state = sampler.init(seed=[1, 2, 3], prompt=[[5, 6], [7], []])

  def step(state, _):
    token, state = sampler.pick(x, state)
    return state, token

  final, scanned = jax.jit(lambda s: jax.lax.scan(step, s, length=10))(state)
  looped, s, pick = [], state, jax.jit(sampler.pick)
  for _ in range(10):
    token, s = pick(x, s)
    looped.append(token)
  np.testing.assert_array_equal(scanned, np.stack(looped))
  assert jax.tree.structure(final) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(state), strict=True):
    assert a.shape == b.shape and a.dtype == b.dtype

  def body(carry):
    i, s = carry
    _, s = sampler.pick(x, s)
    return i + 1, s

  _, after = jax.jit(lambda s: jax.lax.while_loop(lambda c: c[0] < 10, body, (0, s)))(state)
  np.testing.assert_array_equal(after.window, final.window)
  chosen = jax.jit(lambda s: jax.lax.cond(True, lambda: sampler.pick(x, s)[1], lambda: s))(state)
  assert jax.tree.structure(chosen) == jax.tree.structure(state)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_rows_sample_like_their_float32_values(dtype):
  xs, _, per_row, prompts = batch(13, VOCAB, ROWS)
  low = jnp.asarray(np.where(np.isnan(xs), -np.inf, xs), dtype)
  sampler, pick, _ = shared()
  state = sampler.init(seed=np.arange(ROWS), prompt=prompts, **per_row)
  np.testing.assert_array_equal(pick(low, state)[0], pick(low.astype(jnp.float32), state)[0])


def test_neutral_settings_are_the_identity():
  xs, _, _, prompts = batch(17, VOCAB, ROWS)
  sampler, probs_of, _ = shared("probs")
  state = sampler.init(seed=0, prompt=prompts, **NEUTRAL)
  probs = np.asarray(probs_of(jnp.asarray(xs), state), np.float64)
  for i, x in enumerate(xs):
    np.testing.assert_allclose(probs[i], reference.probabilities(x, []), atol=1e-6)
