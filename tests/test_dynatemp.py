"""Dynamic temperature (llama.cpp's temp_ext) against a float64 reference and llama.cpp's float32 arithmetic."""

import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing


def dynamic_t(x: np.ndarray, t: float, spread: float, exponent: float) -> float:
  """temp_ext's temperature in float64, over the survivors of ``x``."""
  alive = x[x > -np.inf]
  if spread <= 0 or alive.size <= 1:
    return t
  low, high = max(0.0, t - spread), t + spread
  log_z = alive.max() + np.log(np.sum(np.exp(alive - alive.max())))
  probs = np.exp(alive - log_z)
  entropy = np.sum(probs * (log_z - alive))
  return low + (high - low) * (entropy / np.log(alive.size)) ** exponent


def temperature_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  alive = x > -np.inf
  if not alive.any():
    return x
  t = dynamic_t(x, s["temperature"], s["dynatemp_range"], s["dynatemp_exponent"])
  if t <= 0:
    y = np.full(x.shape, -np.inf)
    best = int(np.argmax(x))  # the first maximum: ties to the lower id
    y[best] = x[best]
    return y
  return np.where(alive, x / t, -np.inf)


def llama_cpp_temp_ext(x: np.ndarray, t: float, spread: float, exponent: float) -> float:
  """llama_sampler_temp_ext_apply's temperature, literally, in float32: ``size`` counts every
  entry of the array (``-inf`` ones included) and the sums run in sorted order."""
  f = np.float32
  low, high = f(max(0.0, t - spread)), f(t + spread)
  logits = np.sort(x.astype(f))[::-1]
  max_entropy = f(-np.log(f(1.0) / f(x.size)))
  e = np.exp(logits - logits[0]).astype(f)
  total = f(0)
  for v in e:
    total = f(total + v)
  probs = (e / total).astype(f)
  entropy = f(0)
  for q in probs[probs > 0]:
    entropy = f(entropy - f(q * np.log(q)))
  return float(low + (high - low) * f(np.power(entropy / max_entropy, f(exponent))))


SETTINGS = [
  dict(temperature=0.7, dynatemp_range=0.5, dynatemp_exponent=1.0),
  dict(temperature=0.8, dynatemp_range=0.3, dynatemp_exponent=2.0),
  dict(temperature=0.3, dynatemp_range=0.5, dynatemp_exponent=0.5),  # min_temp clamps at 0
  dict(temperature=1.0, dynatemp_range=0.0, dynatemp_exponent=1.0),
  dict(temperature=0.0, dynatemp_range=0.0, dynatemp_exponent=3.0),
  dict(temperature=1.2, dynatemp_range=1.5, dynatemp_exponent=0.0),  # exponent 0: t + range
  dict(temperature=1.6, dynatemp_range=-1.0, dynatemp_exponent=1.0),
]


def test_dynamic_temperature_conforms():
  jsample.testing.assert_stage_conforms(jsample.temperature(), temperature_reference, SETTINGS)


def probs(sampler, x, **settings) -> np.ndarray:
  return np.asarray(sampler.probs(jnp.asarray(x), sampler.init(seed=0, **settings)), np.float64)


def softmax(y: np.ndarray) -> np.ndarray:
  alive = y > -np.inf
  out = np.zeros(y.shape)
  out[alive] = np.exp(y[alive] - y[alive].max())
  return out / out.sum()


@pytest.mark.parametrize("strategy", jsample.testing.STRATEGIES)
def test_dynamic_temperature_is_llama_cpps_where_every_entry_survives(strategy):
  rng = np.random.default_rng(4)
  sampler = jsample.chain(jsample.temperature(), budget=8, strategy=strategy)
  for i, (t, spread, exponent) in enumerate([(0.7, 0.5, 1.0), (1.0, 0.8, 2.0), (0.4, 0.6, 0.5)]):
    x = rng.normal(0, [0.3, 2.0, 5.0][i], 700).astype(np.float32)
    want = softmax(x.astype(np.float64) / llama_cpp_temp_ext(x, t, spread, exponent))
    got = probs(sampler, x, temperature=t, dynatemp_range=spread, dynatemp_exponent=exponent)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-9, err_msg=f"row {i}")


def test_removed_tokens_do_not_count_in_the_maximum_entropy():
  """jsample's N is the survivors: a row with 300 banned (-inf) tokens draws as the row
  without them. llama.cpp counts them in its array size, and so runs hotter (its side)."""
  rng = np.random.default_rng(6)
  x = rng.normal(0, 1.5, 400).astype(np.float32)
  holed = x.copy()
  holed[100:] = -np.inf
  sampler = jsample.chain(jsample.temperature(), budget=8)
  settings = dict(temperature=0.8, dynatemp_range=0.6, dynatemp_exponent=1.0)
  got = probs(sampler, holed, **settings)
  np.testing.assert_allclose(got[:100], probs(sampler, x[:100], **settings), rtol=1e-5, atol=1e-9)
  assert np.all(got[100:] == 0)
  ours, theirs = dynamic_t(x[:100], 0.8, 0.6, 1.0), llama_cpp_temp_ext(holed, 0.8, 0.6, 1.0)
  assert theirs < ours - 0.1  # log 400 > log 100: the normalised entropy, and its temperature, drop


def test_dynamic_temperature_settles_only_on_candidates_that_cover_the_row():
  """After top-k the entropy is the candidates': the row settles there; without it, the
  full path runs; both give the full path's token."""
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(0, 2, (2, 2000)).astype(np.float32))
  for strategy in jsample.testing.STRATEGIES:
    sampler = jsample.chain(jsample.top_k(), jsample.temperature(), budget=16, strategy=strategy)
    state = sampler.init(seed=[3, 4], top_k=[10, 0], temperature=0.9, dynatemp_range=0.5)
    settled = np.asarray(jsample.testing.settled_on_candidates(sampler, x, state))
    np.testing.assert_array_equal(settled, [True, False], err_msg=strategy)
    np.testing.assert_array_equal(
      sampler.pick(x, state)[0], jsample.testing.full_path_tokens(sampler, x, state), err_msg=strategy
    )


def test_temperature_zero_with_a_range_is_not_greedy():
  """temp_ext with t = 0 and range r samples at r * (H / log N) ** exponent: greedy batches
  (Stage.only_best) must not take such a row; with the range off it is greedy again."""
  x = jnp.asarray(np.random.default_rng(9).normal(0, 1, 64).astype(np.float32))
  sampler = jsample.chain(jsample.temperature())
  state = sampler.init(seed=np.arange(200), temperature=0.0, dynatemp_range=0.8)
  tokens = np.asarray(sampler.pick(jnp.broadcast_to(x, (200, 64)), state)[0])
  assert len(set(tokens.tolist())) > 5
  greedy = sampler.configure(state, dynatemp_range=0.0)
  np.testing.assert_array_equal(sampler.pick(jnp.broadcast_to(x, (200, 64)), greedy)[0], int(jnp.argmax(x)))


def test_typical_and_xtc_off_keep_greedy_batches_greedy():
  """Where typical and XTC are off they keep the best token, so a greedy batch through
  them takes the one argmax-like pass: the same token as without them."""
  x = jnp.asarray(np.random.default_rng(10).normal(0, 1, (4, 64)).astype(np.float32))
  sampler = jsample.chain(jsample.typical(), jsample.xtc(), jsample.temperature(0.0))
  assert all(bool(stage.argmax_invariant(sampler.init(seed=0).settings)) for stage in sampler.stages)
  on = sampler.init(seed=[0, 1, 2, 3], typical_p=0.5)
  assert not bool(sampler.stages[0].argmax_invariant(first_row(on.settings)))
  np.testing.assert_array_equal(sampler.pick(x, sampler.init(seed=[0, 1, 2, 3]))[0], np.argmax(x, axis=-1))


def first_row(settings: dict) -> dict:
  return {name: value[0] for name, value in settings.items()}
