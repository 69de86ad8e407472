"""Stages over per-row token-id lists: logit bias, banned ids, allowed ids, min_tokens.

Each goes through the conformance suite against a float64 reference written
here, then through what the suite cannot see: ids far below the raw best,
more touched ids than candidates, a count of new tokens over a generation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jsample
import jsample.testing
from tests.helpers import assert_one_cond

INF = float("inf")
F32_MAX = float(np.finfo(np.float32).max)


def bias_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  """llama.cpp's logit bias in float64: every pair in list order; ids outside the row ignored."""
  y = x.copy()
  for i, b in zip(s["logit_bias_ids"], s["logit_bias_values"], strict=True):
    if 0 <= i < y.size and y[i] > -INF:
      y[i] = y[i] + float(b)
  return np.where(np.isnan(y), -INF, np.minimum(y, F32_MAX))


def banned_reference(ids: np.ndarray, x: np.ndarray) -> np.ndarray:
  y = x.copy()
  y[[i for i in ids if 0 <= i < y.size]] = -INF
  return y


def allowed_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  ids = [i for i in s["allowed_token_ids"] if i >= 0]
  if not ids:
    return x
  keep = np.zeros(x.size, bool)
  keep[[i for i in ids if i < x.size]] = True
  return np.where(keep, x, -INF)


def pad(ids, size, fill=-1):
  return list(ids) + [fill] * (size - len(ids))


BIASES = [
  dict(logit_bias_ids=pad([5, 17, 299, 5], 6), logit_bias_values=pad([3.0, -INF, 1.25, 2.5], 6, 0.0)),
  dict(logit_bias_ids=pad([], 6), logit_bias_values=pad([], 6, 0.0)),
  dict(logit_bias_ids=[0, 1, 2, 3, 4, 1000], logit_bias_values=[-INF, -INF, -1.5, 40.0, 0.0, 9.0]),
  dict(logit_bias_ids=pad([250, 120, 77], 6), logit_bias_values=pad([12.0, 8.0, -0.5], 6, 0.0)),
]


def test_logit_bias_conforms():
  jsample.testing.assert_stage_conforms(jsample.logit_bias(size=6), bias_reference, BIASES)


def test_banned_tokens_conform():
  settings = [
    dict(banned_token_ids=pad([3, 9, 3], 5)),
    dict(banned_token_ids=pad([], 5)),
    dict(banned_token_ids=[0, 1, 2, 299, 400]),
  ]
  ref = lambda x, s, w: banned_reference(s["banned_token_ids"], x)  # noqa: E731
  jsample.testing.assert_stage_conforms(jsample.banned_tokens(size=5), ref, settings)


def test_allowed_tokens_conform():
  settings = [
    dict(allowed_token_ids=pad([7, 200, 31, 7], 8)),
    dict(allowed_token_ids=pad([], 8)),
    dict(allowed_token_ids=[290, 1, 150, 42, 99, 3, 260, 12]),  # more than the budget of 4
    dict(allowed_token_ids=pad([123], 8)),
  ]
  jsample.testing.assert_stage_conforms(jsample.allowed_tokens(size=8), allowed_reference, settings)


def test_min_tokens_conforms():
  """At the first draw nothing was generated yet: every row with min_tokens > 0 bans its ids."""
  settings = [
    dict(min_tokens=3, eos_token_ids=[4, 0, -1]),
    dict(min_tokens=0, eos_token_ids=[4, 0, -1]),
    dict(min_tokens=1, eos_token_ids=[250, 251, 252]),
    dict(min_tokens=0, eos_token_ids=[-1, -1, -1]),
  ]

  def ref(x, s, window):
    return banned_reference(s["eos_token_ids"], x) if s["min_tokens"] > 0 else x

  jsample.testing.assert_stage_conforms(jsample.min_tokens(size=3), ref, settings)


def _both_paths_agree(sampler, x, state, expect_settled=True):
  """Candidates settle (where expected), and every path and strategy gives the same probs and tokens."""
  x = jnp.asarray(x)
  full = np.asarray(jsample.testing.full_path_probs(sampler, x, state))
  tokens = np.asarray(jax.jit(lambda x, s: jsample.testing.full_path_tokens(sampler, x, s))(x, state))
  for strategy in jsample.testing.STRATEGIES:
    run = jsample.chain(*sampler.stages, window_size=sampler.window_size, budget=sampler.budget, strategy=strategy)
    settled = np.asarray(jsample.testing.settled_on_candidates(run, x, state))
    if expect_settled is not None:
      assert np.all(settled == expect_settled), settled
    np.testing.assert_allclose(np.asarray(run.probs(x, state)), full, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(jax.jit(run.pick)(x, state)[0]), tokens)
  return full


def test_allowed_ids_far_below_the_raw_best_are_settled_on_candidates():
  """The raw best hold none of the allowed ids; the cut brings them in, and marks the candidates as covering the row."""
  rng = np.random.default_rng(1)
  x = rng.normal(0, 2, (4, 2000)).astype(np.float32)
  order = np.argsort(-x, axis=1)
  allowed = np.stack([order[i, [1500, 1700, 1999, 1200]] for i in range(4)]).astype(np.int32)
  sampler = jsample.chain(jsample.allowed_tokens(size=4), jsample.top_p(0.9), jsample.temperature(1.0), budget=8)
  state = sampler.init(seed=np.arange(4), allowed_token_ids=allowed)
  probs = _both_paths_agree(sampler, x, state, expect_settled=True)
  assert np.all((probs > 0).sum(axis=1) >= 1)
  for i in range(4):
    assert set(np.nonzero(probs[i])[0]) <= set(allowed[i].tolist())


def test_more_allowed_survivors_than_candidates_take_the_full_path():
  rng = np.random.default_rng(2)
  x = rng.normal(0, 1, (2, 500)).astype(np.float32)
  allowed = np.stack([rng.choice(500, 40, replace=False) for _ in range(2)]).astype(np.int32)
  sampler = jsample.chain(jsample.allowed_tokens(size=40), jsample.top_p(0.95), jsample.temperature(1.0), budget=8)
  state = sampler.init(seed=[0, 1], allowed_token_ids=allowed)
  probs = _both_paths_agree(sampler, x, state, expect_settled=False)
  for i in range(2):
    assert set(np.nonzero(probs[i])[0]) <= set(allowed[i].tolist())
    assert (probs[i] > 0).sum() > 8  # the nucleus reaches past the candidates


def test_a_raising_bias_brings_a_tail_token_to_the_top_on_candidates():
  rng = np.random.default_rng(3)
  x = rng.normal(0, 2, (3, 3000)).astype(np.float32)
  worst = np.argsort(x, axis=1)[:, :2].astype(np.int32)  # the two lowest tokens of each row
  ids = np.concatenate([worst, np.full((3, 2), -1, np.int32)], axis=1)
  values = np.array([[30.0, 29.5, 0, 0]] * 3, np.float32)
  sampler = jsample.chain(jsample.logit_bias(size=4), jsample.top_k(2), jsample.temperature(1.0), budget=8)
  state = sampler.init(seed=[0, 1, 2], logit_bias_ids=ids, logit_bias_values=values)
  probs = _both_paths_agree(sampler, x, state, expect_settled=True)
  for i in range(3):
    assert set(np.nonzero(probs[i])[0]) == set(worst[i].tolist())


def test_repeated_ids_add_up_in_list_order_in_float32():
  """llama.cpp's direct path: ``(x + b1) + b2`` in float32, for the same id twice."""
  x = np.array([1.0, 0.1, -2.0, 3.0], np.float32)
  b1, b2 = np.float32(1e8), np.float32(-1e8)
  sampler = jsample.chain(jsample.logit_bias(size=2), jsample.temperature(1.0), budget=4)
  state = sampler.init(seed=0, logit_bias_ids=[1, 1], logit_bias_values=[b1, b2])
  # The state as an argument: with the biases as compile-time constants XLA may
  # fold (x + b1) + b2 into x + (b1 + b2).
  got = jax.jit(lambda x, state: jsample.testing.full_path_probs(sampler, x, state))(jnp.asarray(x), state)
  want = (x[1] + b1) + b2  # 0.0 in float32: 0.1 is lost in 1e8's rounding
  assert want == 0.0
  ref = np.exp(np.array([1.0, want, -2.0, 3.0]) - 3.0)
  np.testing.assert_allclose(np.asarray(got), ref / ref.sum(), atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(sampler.probs)(jnp.asarray(x), state)), ref / ref.sum(), atol=1e-6)


def test_banning_every_token_leaves_the_row_empty():
  sampler = jsample.chain(jsample.banned_tokens(size=4), jsample.temperature(1.0))
  drawn, _ = sampler.pick_with_info(jnp.zeros(3), sampler.init(seed=0, banned_token_ids=[0, 1, 2, -1]))
  assert not bool(drawn.valid)
  allowed = jsample.chain(jsample.allowed_tokens(size=2), jsample.temperature(1.0))
  drawn, _ = allowed.pick_with_info(jnp.zeros(3), allowed.init(seed=0, allowed_token_ids=[7, -1]))
  assert not bool(drawn.valid)  # an id outside the vocabulary allows nothing


def test_min_tokens_counts_new_tokens_and_starts_again_after_a_prompt():
  eos = 1
  sampler = jsample.chain(jsample.min_tokens(eos=[eos, 3]), jsample.temperature(0.0), window_size=4)
  logits = jnp.array([[0.0, 5.0, 1.0, 4.0]] * 3)  # the EOS ids 1 and 3 are the best tokens
  state = sampler.init(seed=[0, 1, 2], prompt=[[0, 2, 2], [2, -1, -1], [-1, -1, -1]], min_tokens=[2, 0, 3])
  step = jax.jit(sampler.pick)
  got = []
  for _ in range(4):
    token, state = step(logits, state)
    got.append(np.asarray(token).tolist())
  assert got == [[2, 1, 2], [2, 1, 2], [1, 1, 2], [1, 1, 1]]
  # accept counts like a draw; a new prompt starts the count again.
  state = sampler.accept(jnp.array([2, 2, 2]), state)
  state = sampler.load_prompt([[0], [0], [0]], state)
  token, state = step(logits, state)
  assert np.asarray(token).tolist() == [2, 1, 2]
  state = sampler.accept(jnp.array([0, 0, 0]), state)
  token, _ = step(logits, state)
  assert np.asarray(token).tolist() == [1, 1, 2]


def test_vector_settings_are_checked_in_init_and_in_checked_mode():
  sampler = jsample.chain(jsample.logit_bias(size=3), jsample.temperature(1.0))
  with pytest.raises(ValueError, match=r"logit_bias_ids: must be \[3\] or \[B, 3\]"):
    sampler.init(logit_bias_ids=[1, 2])
  with pytest.raises(ValueError, match="logit_bias_values: must be finite or -inf"):
    sampler.init(logit_bias_values=[0.0, np.nan, 0.0])
  with pytest.raises(ValueError, match="logit_bias_values: must be finite or -inf"):
    sampler.init(logit_bias_values=[0.0, INF, 0.0])
  with pytest.raises(ValueError, match="logit_bias_ids: must be >= -1"):
    sampler.init(logit_bias_ids=[[0, 1, 2], [0, -2, 1]])
  with pytest.raises(ValueError, match="batch sizes disagree"):
    sampler.init(logit_bias_ids=[[0, 1, 2], [0, 1, 2]], seed=[1, 2, 3])
  state = sampler.init(seed=[1, 2], logit_bias_values=[-INF, 1.0, 0.0])
  assert state.settings["logit_bias_values"].shape == (2, 3)
  state = sampler.configure(state, logit_bias_ids=[[4, -1, -1], [5, 6, -1]])
  np.testing.assert_array_equal(state.settings["logit_bias_ids"], [[4, -1, -1], [5, 6, -1]])

  checked = sampler.checked()

  @jax.jit
  @checkify.checkify
  def step(x, state, ids):
    return checked.pick(x, state._replace(settings={**state.settings, "logit_bias_ids": ids}))

  err, _ = step(jnp.zeros((2, 8)), state, jnp.array([[4, -1, -1], [5, -7, -1]], jnp.int32))
  assert "logit_bias_ids: must be >= -1 (-1 pads the list); row 1 holds -7" in str(err.get())
  err, _ = step(jnp.zeros((2, 8)), state, jnp.array([[4, -1, -1], [5, 7, -1]], jnp.int32))
  assert err.get() is None


def test_lists_longer_than_their_size_are_refused():
  with pytest.raises(ValueError, match="at most size=2"):
    jsample.logit_bias({1: 1.0, 2: 1.0, 3: 1.0}, size=2)
  with pytest.raises(ValueError, match="at most size=1"):
    jsample.allowed_tokens([1, 2], size=1)


def test_the_accelerator_program_stays_branch_free_with_every_new_stage():
  """As tests/test_structure.py asks of the recipes: no host loops and one cond, at B = 64, V = 262144."""
  stages = (
    jsample.allowed_tokens(size=8),
    jsample.banned_tokens(size=4),
    jsample.min_tokens(2, eos=[1]),
    jsample.logit_bias({5: 2.0}),
    jsample.penalties(1.1, 0.1, 0.1, scope="openai"),
    jsample.top_k(40),
    jsample.top_p(0.95),
    jsample.temperature(0.8),
  )
  sampler = jsample.chain(*stages, strategy="accelerator")
  logits = jax.ShapeDtypeStruct((64, 262144), jnp.float32)
  state = sampler.init(seed=np.arange(64), prompt=np.zeros((64, 8), np.int32))
  assert_one_cond(jax.make_jaxpr(sampler.pick)(logits, state).jaxpr)
