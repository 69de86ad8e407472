"""The stage contract's wider parts: per-stage state, per-call inputs, vector settings,
the row's own coin, token ids checked against the vocabulary, touched ids before the cut."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing

V = 64


def surprise_total() -> jsample.Stage:
  """Keeps nothing out; its state adds up the surprise -log p of every drawn token (as mirostat does)."""

  def on_candidates(c, s, ctx):
    return c

  def on_row(logits, s, ctx):
    return logits

  def update(total, token, logprob, s, ctx):
    return total + jnp.where(jnp.isnan(logprob), 0.0, -logprob)

  return jsample.Stage("surprise", (), on_candidates, on_row, init_state=lambda: jnp.float32(0), update=update)


def excluded_ids(count: int = 3) -> jsample.Stage:
  """Removes per-call ids ``exclude [B, count]`` (-1: none), and per-row setting ids ``ban [count]``."""
  ban = jsample.Setting("ban", np.full(count, -1), jnp.int32, lambda v: v >= -1, ">= -1", -1, "ids to ban", (count,))

  def removed(ids, s, ctx):
    out = jnp.concatenate([ctx.inputs["exclude"], s["ban"]])
    return jnp.any(ids[:, None] == out[None, :], axis=1)

  def rule(logits, ids, best, s, ctx):
    return jnp.where(removed(ids, s, ctx), -jnp.inf, logits)

  stage = jsample.elementwise("exclude", (ban,), rule)
  return stage._replace(inputs=("exclude",))


def test_a_stage_keeps_its_own_state_through_draws_scan_and_accept():
  sampler = jsample.chain(surprise_total(), jsample.top_k(8), jsample.temperature(1.0), budget=4)
  state = sampler.init(seed=[1, 2, 3])
  x = jnp.asarray(np.random.default_rng(0).normal(0, 2, (3, V)), jnp.float32)
  total = np.zeros(3)
  step = jax.jit(sampler.pick_with_info)
  for _ in range(4):
    drawn, state = step(x, state)
    total -= np.asarray(drawn.logprob)
  np.testing.assert_allclose(state.stages["surprise"], total, rtol=1e-6)

  def body(state, _):
    token, state = sampler.pick(x, state)
    return state, token

  scanned, _ = jax.lax.scan(body, state, None, length=3)
  assert np.all(np.asarray(scanned.stages["surprise"]) >= total)
  accepted = sampler.accept(jnp.array([1, 2, 3]), scanned)
  np.testing.assert_array_equal(accepted.stages["surprise"], scanned.stages["surprise"])  # NaN logprob: unchanged
  assert int(accepted.position[0]) == 8


def test_stateful_stages_need_distinct_names():
  with pytest.raises(ValueError, match="distinct names"):
    jsample.chain(surprise_total(), surprise_total())


def test_per_call_inputs_and_vector_settings_reach_the_stage():
  sampler = jsample.chain(excluded_ids(), jsample.temperature(0.0), budget=8)
  x = jnp.tile(jnp.arange(V, dtype=jnp.float32)[::-1], (2, 1))  # token 0 is the best, then 1, 2, ...
  state = sampler.init(seed=[0, 1], ban=[[0, -1, -1], [0, 1, 2]])
  exclude = jnp.array([[1, 2, -1], [3, -1, -1]], jnp.int32)
  token, _ = jax.jit(sampler.pick)(x, state, exclude=exclude)
  np.testing.assert_array_equal(token, [3, 4])
  probs = sampler.probs(x, state, exclude=exclude)
  np.testing.assert_array_equal(np.argmax(probs, axis=1), [3, 4])
  with pytest.raises(ValueError, match="exclude: the stage"):
    sampler.pick(x, state)
  with pytest.raises(ValueError, match="bias: not an input"):
    sampler.pick(x, state, exclude=exclude, bias=exclude)
  with pytest.raises(ValueError, match="ban"):
    sampler.init(ban=[1, 2])  # one row needs [3]


def test_the_row_coin_is_the_rows_own():
  """A stage that keeps the single token its coin names: the token reveals the coin."""

  def rule(logits, ids, best, s, ctx):
    return jnp.where(ids == jnp.floor(ctx.uniform(7) * V).astype(jnp.int32), logits, -jnp.inf)

  sampler = jsample.chain(jsample.elementwise("coin", (), rule), jsample.temperature(1.0), budget=V)
  pick = jax.jit(sampler.pick)
  a, _ = pick(jnp.zeros((3, V)), sampler.init(seed=[5, 6, 7]))
  b, _ = pick(jnp.zeros((2, V)), sampler.init(seed=[7, 5]))
  assert int(a[2]) == int(b[0]) and int(a[0]) == int(b[1])  # by seed, whatever the slot or batch
  later, _ = pick(jnp.zeros((3, V)), sampler.init(seed=[5, 6, 7], prompt=[1]))
  assert np.any(np.asarray(later) != np.asarray(a))  # a new coin at the next position


def test_a_prompt_id_past_the_vocabulary_is_refused_at_pick():
  sampler = jsample.llama_cpp()
  state = sampler.init(prompt=[[5, 2000]])  # no vocab_size: not checkable yet
  with pytest.raises(ValueError, match=r"state.window: token ids must be in \[0, 1000\)"):
    sampler.pick(jnp.zeros((1, 1000)), state)
  checked = sampler.checked()
  from jax.experimental import checkify

  err, _ = jax.jit(checkify.checkify(checked.pick))(jnp.zeros((1, 1000)), state)
  assert "state.window" in str(err.get())


def test_raising_penalties_are_settled_on_candidates():
  """Touched ids join the cut, so weights that raise logits need no full path."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(0, 2, (4, 2000)), jnp.float32)
  sampler = jsample.llama_cpp(top_k=40, repeat_penalty=0.5, presence_penalty=-3.0, budget=64, window_size=8)
  state = sampler.init(seed=np.arange(4), prompt=rng.integers(0, 2000, (4, 8)))
  settled, tokens, full_tokens = jax.jit(  # one program, not the decision run op by op
    lambda x, s: (
      jsample.testing.settled_on_candidates(sampler, x, s),
      sampler.pick(x, s)[0],
      jsample.testing.full_path_tokens(sampler, x, s),
    )
  )(x, state)
  assert bool(jnp.all(settled))
  np.testing.assert_array_equal(tokens, full_tokens)


# The weights are state values: one sampler and one program (both paths, the cut's decision, the tokens) serve
# every case below.
WIDE_WINDOW = jsample.llama_cpp(top_k=6, top_p=0.97, min_p=0.01, window_size=33, budget=8)


@functools.cache
def wide_window_program():
  s = WIDE_WINDOW
  return jax.jit(
    lambda x, state: (
      jsample.testing.settled_on_candidates(s, x, state),
      s.probs(x, state),
      jsample.testing.full_path_probs(s, x, state),
      s.pick(x, state)[0],
      jsample.testing.full_path_tokens(s, x, state),
    )
  )


@pytest.mark.parametrize(
  "weights", [dict(repeat_penalty=1.5, presence_penalty=0.5), dict(repeat_penalty=0.6, frequency_penalty=-0.4)]
)
def test_a_window_longer_than_the_budget_keeps_the_cut_exact(weights):
  """More touched ids than candidates (W > K): the cut takes the K best of each part, then the K best of those."""
  rng = np.random.default_rng(5)
  x = rng.normal(0, 2, (8, 300)).astype(np.float32)
  x[:, :40] = np.round(x[:, :40])  # ties among the window's tokens
  # Mostly tokens ranked 10-200, so at most m of them sit among the raw best and the cut decides.
  prompts = [list(rng.choice(np.argsort(-row)[10:200], 32)) + [int(np.argmax(row))] for row in x]
  state = WIDE_WINDOW.init(seed=np.arange(8), prompt=prompts, **weights)
  settled, probs, full_probs, tokens, full_tokens = wide_window_program()(jnp.asarray(x), state)
  assert bool(jnp.all(settled))
  np.testing.assert_allclose(probs, full_probs, atol=1e-6)
  np.testing.assert_array_equal(tokens, full_tokens)
