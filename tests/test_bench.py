"""The benchmark's baselines draw from the same distribution as jsample's reference.

Each baseline is another engine's algorithm, written for the benchmark; these
tests make sure the benchmark times honest implementations of the same chain
(temperature first, then top-k, then top-p), not cheaper approximations.
"""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bench import baselines
from tests.reference import probabilities

SETTINGS = [(1.0, 0, 1.0), (0.7, 50, 1.0), (1.6, 0, 0.9), (1.0, 64, 0.95), (0.5, 3, 0.5), (2.0, 1000, 0.3)]


def hf_stages(t, k, p):
  return [("temperature", t), ("top_k", k), ("top_p", p)]


@pytest.mark.parametrize("base", baselines.BASELINES, ids=lambda b: b.name)
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_baseline_probabilities_match_the_reference(base, setting):
  t, k, p = setting
  if base.name == "lax.top_k" and k <= 0:
    pytest.skip("lax.top_k needs top-k on")
  rng = np.random.default_rng(0)
  # Continuous rows (no exact ties): the bit search keeps every tie at its boundary.
  xs = np.stack([rng.normal(0, scale, 1000) for scale in (0.3, 1.0, 3.0, 8.0)]).astype(np.float32)
  got = np.asarray(jax.jit(base.probs, static_argnums=(1, 2, 3))(jnp.asarray(xs), t, k, p), np.float64)
  for x, row in zip(xs, got, strict=True):
    want = probabilities(x, hf_stages(t, k, p))
    np.testing.assert_array_equal(row > 0, want > 0)
    np.testing.assert_allclose(row, want, atol=1e-6)


@pytest.mark.parametrize("base", baselines.BASELINES, ids=lambda b: b.name)
def test_baseline_draws_follow_the_reference(base):
  t, k, p = 0.8, 5, 0.9
  x = np.log(np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02], np.float32))
  n = 40_000
  tokens = jax.jit(base.sample, static_argnums=(2, 3, 4))(jax.random.key(1), jnp.tile(jnp.asarray(x), (n, 1)), t, k, p)
  want = probabilities(x, hf_stages(t, k, p))
  alive = want > 0
  counts = np.bincount(np.asarray(tokens), minlength=x.size)
  assert counts[~alive].sum() == 0
  assert stats.chisquare(counts[alive], want[alive] * n).pvalue > 1e-4


# -- the harness: loops, strategies, PyTorch peers, target tables ---------------------------------------------------


def test_a_loop_step_costs_what_a_call_does_and_sees_changing_logits():
  from bench import run

  logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 64)), jnp.float32)
  seen = []

  def step(i, x, carry):
    seen.append(x.shape)
    return jnp.argmax(x, axis=-1), carry

  assert run.looped(step, logits, (), steps=3, reps=1) > 0
  assert seen == [(3, 64)]  # traced once, inside the loop


def test_strategy_goes_to_the_recipes_only_when_given(monkeypatch):
  import jsample
  from bench import workloads

  calls = []
  stub = jsample.chain(jsample.temperature(1.0))
  for name in ("gemma", "llama_cpp", "hf"):
    monkeypatch.setattr(workloads.jsample, name, lambda **kw: calls.append(kw) or stub)
  workloads.workloads(4)
  assert calls and not any("strategy" in kw for kw in calls)
  calls.clear()
  labels = [w.label for w in workloads.workloads(4, strategy="accelerator", quarters=True)]
  assert calls and all(kw["strategy"] == "accelerator" for kw in calls)
  assert labels == list("abcdefghi") + ["e1", "e2", "e3", "e4"]


def test_mixed_batch_is_its_four_quarters():
  from bench import workloads

  mixed = workloads._mixed(8)
  for q, values in enumerate(workloads.QUARTERS):
    for name, value in zip(workloads.NAMES, values, strict=True):
      assert mixed[name][2 * q : 2 * q + 2] == [value, value]


def test_torch_peers_are_skipped_without_torch():
  """In a process of its own: torch and XLA in one process can crash it (their native libraries clash), and
  the suite's process must never load torch."""
  check = """
import numpy as np
from bench import torch_peers
try:
  import torch
except ImportError:
  assert not torch_peers.available()
else:
  x = torch_peers.tensor(np.random.default_rng(0).normal(size=(4, 100)).astype(np.float32), "float32")
  for peer in torch_peers.PEERS:
    tokens = peer.sample(x, 1.0, 5, 0.9, 0.05)
    assert tuple(tokens.shape) == (4,) and int(tokens.min()) >= 0 and int(tokens.max()) < 100
"""
  root = Path(__file__).resolve().parents[1]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
  done = subprocess.run([sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr


def test_accelerator_targets_read_b256_and_b1():
  from bench import run

  def entry(batch, workload, ratio):
    return dict(vocab=262144, batch=batch, dtype="float32", rows="real", workload=workload, ratio=ratio)

  results = [entry(256, w, r) for w, r in dict(a=3.0, b=7.0, c=10.0, d=1.1, g=3.0, e=2.0).items()]
  results += [entry(256, f"e{q}", r) for q, r in zip(range(1, 5), (1.0, 2.0, 1.5, 1.2), strict=True)]
  results += [entry(256, "c:torch vllm sort", 35.0), entry(1, "a", 2.0)]
  checks = {what: met for what, _, met in run.targets(results, accelerator=True)}
  assert checks == {
    "(d) real B=256 <= 1.2x": True,
    "(a) real B=256 <= 4.0x": True,
    "(b) real B=256 <= 6.0x": False,
    "(c) real B=256 <= 30.0x": True,
    "(g) real B=256 <= 3.5x": True,
    "(c) real B=256 >= 3.0x faster than vLLM sort": True,
    "(e) real B=256 <= 1.2x its slowest quarter": True,
    "(a) real B=1 <= 2.5x": True,
  }
  assert run.targets(results, accelerator=False) == []  # the CPU's table reads B=64


def test_compare_times_the_shared_workloads_and_checks_their_tokens():
  from jax import export

  from bench import compare

  x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)

  def program(fn):
    shapes = (jax.ShapeDtypeStruct(x.shape, x.dtype), [])
    return export.export(jax.jit(lambda x, leaves: fn(x, axis=-1)))(*shapes).serialize(), (x, [])

  before = {("real", "a"): program(jnp.argmax), ("flat", "a"): program(jnp.argmax)}
  after = {("real", "a"): program(jnp.argmax), ("flat", "a"): program(jnp.argmin), ("real", "i"): program(jnp.argmax)}
  rows = compare.interleaved(before, after, reps=3)
  assert [(r["kind"], r["label"], r["same_tokens"]) for r in rows] == [("real", "a", True), ("flat", "a", False)]
  assert all(r["reps"] == 3 and 0 <= r["after_faster"] <= 3 and r["before_ms"] > 0 for r in rows)


def test_backends_compare_finds_a_moved_token_and_a_logprob_gap():
  """bench.backends' comparison passes equal draws and names what differs: a token, a flag, a logprob."""
  from bench import backends

  draws = {
    "gemma/cpu/defaults/token": np.array([[3, 5]]),
    "gemma/cpu/defaults/valid": np.array([[True, True]]),
    "gemma/cpu/defaults/logprob": np.array([[-0.5, -np.inf]], np.float32),
  }
  assert backends.compare(draws, dict(draws))[0].startswith("equal")
  moved = dict(draws, **{"gemma/cpu/defaults/token": np.array([[3, 6]])})
  assert "1 of 2 tokens moved" in backends.compare(moved, draws)[0]
  shifted = dict(draws, **{"gemma/cpu/defaults/logprob": np.array([[-0.49, -np.inf]], np.float32)})
  assert backends.compare(shifted, draws)[0].startswith("DIFFERS")
  assert "not in the other file" in backends.compare(draws, {})[0]
