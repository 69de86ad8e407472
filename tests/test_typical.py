"""Typical sampling against a float64 reference, and against llama.cpp's own float32 arithmetic."""

import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from tests.helpers import EACH_STRATEGY


def typical_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  """Typical sampling in float64: rank survivors by |surprise - H| (ties to the lower id),
  keep the shortest prefix whose mass exceeds p and holds at least min_keep tokens."""
  p, least = s["typical_p"], s["min_keep"]
  ids = np.nonzero(x > -np.inf)[0]
  if p >= 1 or ids.size == 0:
    return x
  logits = x[ids]
  log_z = logits.max() + np.log(np.sum(np.exp(logits - logits.max())))
  probs = np.exp(logits - log_z)
  entropy = np.sum(probs * (log_z - logits))
  order = np.lexsort((ids, np.abs(log_z - logits - entropy)))
  cum = np.cumsum(probs[order])
  passed = np.nonzero((cum > p) & (np.arange(ids.size) >= least - 1))[0]
  if passed.size == 0:
    return x
  y = np.full(x.shape, -np.inf)
  kept = ids[order[: passed[0] + 1]]
  y[kept] = x[kept]
  return y


def llama_cpp_typical(x: np.ndarray, p: float, min_keep: int) -> tuple[np.ndarray, float]:
  """llama.cpp's llama_sampler_typical_apply, literally, in float32 (array order = sorted by
  logit, ties by id): ``(kept ids, H)``. Every entry of the array counts, -inf included."""
  f = np.float32
  order = np.lexsort((np.arange(x.size), -x))
  logits = x[order].astype(f)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    e = np.exp(logits - logits[0]).astype(f)
    total = f(0)
    for v in e:
      total = f(total + v)
    probs = (e / total).astype(f)
    entropy = f(0)
    for q in probs:
      entropy = f(entropy + f(-q * np.log(q)))
    scores = np.abs(-np.log(probs) - entropy).astype(f)
  rank = np.lexsort((order, scores))  # std::sort of NaN scores is arbitrary: only H is compared then
  cum, last = f(0), x.size
  for i, j in enumerate(rank):
    cum = f(cum + probs[j])
    if cum > p and (min_keep == 0 or i >= min_keep - 1):
      last = i + 1
      break
  return np.sort(order[rank[:last]]), float(entropy)


def survivors(sampler, x, **settings) -> np.ndarray:
  probs = np.asarray(sampler.probs(jnp.asarray(x), sampler.init(seed=0, **settings)))
  return np.nonzero(probs > 0)[0]


SETTINGS = [
  dict(typical_p=0.5123, min_keep=0),
  dict(typical_p=1.0, min_keep=0),
  dict(typical_p=0.9071, min_keep=5),
  dict(typical_p=0.2017, min_keep=1),
  dict(typical_p=0.0, min_keep=3),
  dict(typical_p=0.7013, min_keep=400),
]


def test_typical_conforms():
  jsample.testing.assert_stage_conforms(jsample.typical(), typical_reference, SETTINGS)


@pytest.mark.parametrize("strategy", EACH_STRATEGY)
def test_typical_equals_llama_cpp_where_llama_cpp_is_defined(strategy):
  """No candidate of probability 0: llama.cpp's float32 arithmetic and jsample keep the same tokens."""
  rng = np.random.default_rng(5)
  sampler = jsample.chain(jsample.typical(), jsample.temperature(1.0), budget=16, strategy=strategy)
  for i in range(12):
    x = rng.normal(0, rng.uniform(0.5, 3), 500).astype(np.float32)
    p, least = [0.3017, 0.6019, 0.9513][i % 3], [0, 1, 7, 60][i % 4]
    kept, entropy = llama_cpp_typical(x, p, least)
    assert np.isfinite(entropy)
    np.testing.assert_array_equal(survivors(sampler, x, typical_p=p, min_keep=least), kept, err_msg=f"row {i}")


def test_a_token_of_probability_zero_does_not_disable_typical():
  """llama.cpp's bug and jsample's choice: with a banned (-inf) token or one ~104 nats
  below the best, llama.cpp's entropy is NaN and its cut arbitrary; jsample's cut is the
  one of the row without that token (the mathematically right one)."""
  rng = np.random.default_rng(8)
  sampler = jsample.chain(jsample.typical(), jsample.temperature(1.0), budget=16)
  x = rng.normal(0, 2, 400).astype(np.float32)
  clean, entropy = llama_cpp_typical(x, 0.9, 0)
  assert np.isfinite(entropy) and clean.size < 300
  for hole in (-np.inf, x.max() - 200):
    holed = x.copy()
    holed[17] = hole
    _, broken = llama_cpp_typical(holed, 0.9, 0)
    assert np.isnan(broken)  # llama.cpp's side: H is NaN, its cut meaningless
    # jsample's side: the token counts as absent (or, 200 nats down, as the least typical)
    without = np.delete(np.arange(x.size), 17)
    expected, _ = llama_cpp_typical(x[without], 0.9, 0)
    np.testing.assert_array_equal(survivors(sampler, holed, typical_p=0.9), without[expected])


def test_typical_settles_on_candidates_from_the_row_entropy():
  """With the entropy as a row statistic, a peaked row settles on 16 candidates of 4096;
  a flat one, whose typical set lies beyond them, takes the full path, with the same tokens."""
  rng = np.random.default_rng(3)
  peaked = (-2.0 * np.log1p(rng.permutation(4096))).astype(np.float32)
  flat = rng.normal(0, 0.3, 4096).astype(np.float32)
  x = jnp.asarray(np.stack([peaked, flat]))
  for strategy in jsample.testing.STRATEGIES:
    sampler = jsample.chain(jsample.typical(), jsample.temperature(1.0), budget=16, strategy=strategy)
    state = sampler.init(seed=[1, 2], typical_p=0.5)
    settled = np.asarray(jsample.testing.settled_on_candidates(sampler, x, state))
    np.testing.assert_array_equal(settled, [True, False], err_msg=strategy)
    np.testing.assert_array_equal(
      sampler.pick(x, state)[0], jsample.testing.full_path_tokens(sampler, x, state), err_msg=strategy
    )
