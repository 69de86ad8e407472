"""The accelerator strategy's program keeps its shape: batched, branch-free, one read of the logits or so.

Measured on a CPU, so that the property cannot erode when no accelerator is at
hand: for the benchmark's workloads at B = 64, V = 262144, the jaxpr of
``pick`` holds no ``while`` (a loop whose predicate the host must read) and
one ``cond``, around the rare full-vocabulary path (on a GPU each conditional
is a host round trip; a greedy row takes the candidate path like any other).
Loops of fixed length (``scan``: the prefix searches' passes) sit only on that
rare path. XLA's count of bytes accessed stays within a stated multiple of the
logits' bytes.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from bench.program import equations
from tests.helpers import EACH_STRATEGY, assert_one_cond, primitives

B, V = 64, 262144

WORKLOADS = {
  "a default chain, repeat 1.1": (jsample.gemma, dict(repeat_penalty=1.1)),
  "b llama.cpp order, top-k off": (jsample.llama_cpp, dict(top_k=0, top_p=0.95, min_p=0.05)),
  "d greedy": (jsample.gemma, dict(temperature=0.0)),
  "g pure sampling": (jsample.gemma, dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_accelerator_program_has_no_host_loops_and_one_cond(name):
  recipe, settings = WORKLOADS[name]
  sampler = recipe(strategy="accelerator")
  logits = jax.ShapeDtypeStruct((B, V), jnp.float32)
  state = sampler.init(seed=np.arange(B), prompt=np.zeros((B, 8), np.int32), **settings)
  common = assert_one_cond(jax.make_jaxpr(sampler.pick)(logits, state).jaxpr)
  # Every call finds its candidates with top_k. Outside the rare path,
  # exponentials and logarithms see the candidates alone, and sorts and sums at
  # most an eighth of a row (the chunk maxima, V / 16; the candidates against
  # the window, 400 x 64), never a whole row.
  assert "top_k" in [eqn.primitive.name for eqn in common]
  for eqn in common:
    if eqn.primitive.name in {"exp", "log"}:
      assert all(v.aval.size <= B * sampler.budget for v in eqn.invars), eqn
    if eqn.primitive.name in {"sort", "cumsum", "reduce_sum"}:
      assert all(v.aval.size <= B * V // 8 for v in eqn.invars), eqn


@pytest.mark.parametrize("recipe", [jsample.llama_cpp, jsample.vllm])
def test_the_accelerator_full_path_does_not_run_the_stages_before_the_cut_again(recipe):
  """The stages before the cut (penalties, logit bias, DRY, id lists) ran once, on the cut's ids: the full path
  writes their logits into the cleaned row (one scatter over ``V``) instead of counting, biasing and matching
  over ``V`` again (a scatter-add, a scatter-max and more scatters over ``V`` before)."""
  sampler = recipe(strategy="accelerator")
  vocab = 4096  # the structure does not depend on V
  logits = jax.ShapeDtypeStruct((8, vocab), jnp.float32)
  jaxpr = jax.make_jaxpr(sampler.pick)(logits, sampler.init(seed=np.arange(8))).jaxpr
  over_row = [
    eqn.primitive.name
    for eqn in equations(jaxpr)
    if eqn.primitive.name.startswith("scatter") and eqn.invars[0].aval.shape[-1] == vocab
  ]
  assert over_row == ["scatter"], over_row


def test_the_cpu_program_keeps_its_loops():
  """The CPU strategy is the other side of the seam: it skips work with loops and conditionals."""
  sampler = jsample.gemma(strategy="cpu")
  logits = jax.ShapeDtypeStruct((B, V), jnp.float32)
  state = sampler.init(seed=np.arange(B), repeat_penalty=1.1)
  every = primitives(jax.make_jaxpr(sampler.pick)(logits, state).jaxpr)
  assert "scan" in every and every.count("cond") > 1  # lax.map and fori_loop are scans


def bytes_read(fn, *args) -> float:
  """XLA's bytes accessed by the compiled ``fn``, over the logits' bytes."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return cost["bytes accessed"] / (B * V * 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["a default chain, repeat 1.1", "d greedy"])
def test_the_accelerator_candidate_path_reads_the_logits_a_few_times(name):
  recipe, settings = WORKLOADS[name]
  sampler = recipe(strategy="accelerator")
  logits = jax.ShapeDtypeStruct((B, V), jnp.float32)
  state = sampler.init(seed=np.arange(B), **settings)
  # What a call costs when the candidates decide every row (XLA counts both
  # branches of the cond, so the whole program's figure includes the full path).
  read = bytes_read(lambda x, s: jsample.testing.candidate_path(sampler, x, s, statistics=False), logits, state)
  # 5.3x when written (XLA's CPU cost model counts each fusion's operands: the
  # cleaned chunk maxima, the gathered chunks, the window's ids); a pass more
  # over the row fails it.
  assert read < 6, f"{read:.1f}x the logits' bytes"


def test_vmap_of_pick_runs_the_batched_program():
  """``jax.vmap(sampler.pick)`` gets pick's own batching rule: the batched call, not a map of the one-row one."""
  sampler = jsample.gemma(strategy="accelerator", repeat_penalty=1.1)
  logits = jax.ShapeDtypeStruct((B, V), jnp.float32)
  state = sampler.init(seed=np.arange(B), prompt=np.zeros((B, 8), np.int32))
  every = primitives(jax.make_jaxpr(jax.vmap(sampler.pick))(logits, state).jaxpr)
  assert "while" not in every and every.count("cond") == 1


@pytest.mark.parametrize("strategy", EACH_STRATEGY)
def test_vmap_of_pick_gives_the_batched_tokens_with_shared_and_per_row_arguments(strategy):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(0, 2, (6, 3000)), jnp.float32)
  allowed = jnp.asarray(rng.random((6, 3000)) < 0.5)
  # Gemma's chain: the window and per-row settings are in its state; the batching rule is the same for every chain.
  sampler = jsample.gemma(strategy=strategy, top_k=0, top_p=[0.9, 1.0, 0.5, 0.99, 0.95, 0.7], repeat_penalty=1.1)
  state = sampler.init(seed=np.arange(6), prompt=rng.integers(0, 3000, (6, 5)))
  pick = jax.jit(sampler.pick)  # one compiled program for both batched calls below
  batched = pick(x, state, allowed)
  mapped = jax.jit(jax.vmap(sampler.pick))(x, state, allowed)
  np.testing.assert_array_equal(mapped[0], batched[0])
  np.testing.assert_array_equal(mapped[1].window, batched[1].window)
  shared = jax.jit(jax.vmap(sampler.pick, in_axes=(None, 0, None)))(x[0], state, allowed[0])  # one row for all
  np.testing.assert_array_equal(shared[0], pick(jnp.tile(x[:1], (6, 1)), state, jnp.tile(allowed[:1], (6, 1)))[0])
  probs = jax.jit(jax.vmap(sampler.probs))(x, state, allowed)
  np.testing.assert_allclose(probs, jax.jit(sampler.probs)(x, state, allowed), atol=1e-7)


def test_a_call_outside_jit_compiles_once(caplog):
  """Called on concrete arrays, a sampler compiles each method once per shape and keeps it: a second call with
  new settings, seeds and logits compiles nothing (run op by op, each call would compile its conditionals
  again), and draws what ``jax.jit`` of the method draws."""
  sampler = jsample.chain(jsample.top_p(), jsample.temperature(), window_size=4, budget=4)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 40)).astype(np.float32)
  sampler.pick(x, sampler.init(seed=[1, 2, 3]))
  state = sampler.init(seed=[4, 5, 6], top_p=[0.5, 0.9, 1.0], temperature=[0.0, 0.7, 1.5])
  with caplog.at_level("WARNING"), jax.log_compiles():
    caplog.clear()
    tokens, after = sampler.pick(2 * x, state)
    compiles = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.getMessage()]
  assert not compiles, compiles
  expected, expected_state = jax.jit(sampler.pick)(2 * x, state)
  np.testing.assert_array_equal(tokens, expected)
  np.testing.assert_array_equal(after.window, expected_state.window)
