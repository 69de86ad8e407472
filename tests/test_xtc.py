"""XTC against a float64 reference; its coin from the row's own stream; the shared min_keep."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing


def xtc_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  """XTC in float64 where its coin is certain (probability 0 or 1): drop the tokens of
  p >= threshold but the last of them in sampling order, unless fewer than min_keep remain."""
  chance, t, least = s["xtc_probability"], s["xtc_threshold"], s["min_keep"]
  if chance <= 0 or t > 0.5:
    return x
  assert chance == 1, "the reference knows no coin"
  order = np.lexsort((np.arange(x.size), -x))
  order = order[x[order] > -np.inf]
  if order.size == 0:
    return x
  probs = np.exp(x[order] - x[order[0]])
  probs /= probs.sum()
  gone = int(np.sum(probs >= t)) - 1
  y = x.copy()
  if gone > 0 and order.size - gone >= least:
    y[order[:gone]] = -np.inf
  return y


SETTINGS = [
  dict(xtc_probability=1.0, xtc_threshold=0.1013, min_keep=0),
  dict(xtc_probability=0.0, xtc_threshold=0.1013, min_keep=0),
  dict(xtc_probability=1.0, xtc_threshold=0.0517, min_keep=2),
  dict(xtc_probability=1.0, xtc_threshold=0.6, min_keep=0),
  dict(xtc_probability=1.0, xtc_threshold=0.0, min_keep=0),
  dict(xtc_probability=1.0, xtc_threshold=0.0113, min_keep=250),
]


def test_xtc_conforms():
  jsample.testing.assert_stage_conforms(jsample.xtc(), xtc_reference, SETTINGS)


ROW = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02], np.float32))
CUT = np.array([0, 0, 1, 1, 1, 1, 1], bool)  # threshold 0.12: 0.4 and 0.25 go; 0.15 stays


def acted(sampler, probs: np.ndarray) -> np.ndarray:
  """Per row: did XTC act (the row's survivors are CUT's) or not (all survive)?"""
  alive = np.asarray(probs) > 0
  cut = np.all(alive == CUT, axis=-1)
  assert np.all(cut | np.all(alive, axis=-1))
  return cut


@pytest.mark.parametrize("strategy", jsample.testing.STRATEGIES)
def test_the_coin_comes_up_with_the_chance_given(strategy):
  sampler = jsample.chain(jsample.xtc(0.3, 0.12), jsample.temperature(1.0), budget=4, strategy=strategy)
  n = 4000
  state = sampler.init(seed=np.arange(n))
  probs = jax.jit(sampler.probs)  # one program: the two states differ in values only
  rows = jnp.broadcast_to(ROW, (n, ROW.size))
  first = acted(sampler, probs(rows, state))
  rate = first.mean()
  assert abs(rate - 0.3) < 5 * np.sqrt(0.3 * 0.7 / n), rate
  # The next position draws a new coin.
  later = sampler.load_prompt([1], state)
  again = acted(sampler, probs(rows, later))
  assert 0.5 < np.mean(again == first) < 0.7  # independent coins agree with chance 0.3² + 0.7² = 0.58


def test_the_coin_is_the_rows_own():
  """A row's coin and token do not depend on its slot, the batch size, the path or the strategy."""
  seeds = np.arange(64) * 7 + 3
  xs = np.broadcast_to(ROW, (64, ROW.size))
  outcomes = {}
  for strategy in jsample.testing.STRATEGIES:
    for budget in (2, 16):
      sampler = jsample.chain(jsample.xtc(0.5, 0.12), jsample.temperature(1.0), budget=budget, strategy=strategy)
      state = sampler.init(seed=seeds)
      # One program for the distribution, the tokens and the full path's tokens: compiling is the test's time.
      run = jax.jit(
        lambda x, s, sampler=sampler: (
          sampler.probs(x, s),
          sampler.pick(x, s)[0],
          jsample.testing.full_path_tokens(sampler, x, s),
        )
      )
      probs, tokens, full = (np.asarray(a) for a in run(jnp.asarray(xs), state))
      np.testing.assert_array_equal(tokens, full)
      outcomes[strategy, budget] = acted(sampler, probs), tokens
      # reversed and alone: the same coin and token for the same seed
      rev = np.asarray(run(jnp.asarray(xs), sampler.init(seed=seeds[::-1]))[1])
      np.testing.assert_array_equal(rev[::-1], tokens)
      alone = jax.jit(sampler.probs)(jnp.asarray(ROW), sampler.init(seed=int(seeds[5])))
      assert acted(sampler, np.asarray(alone)[None])[0] == outcomes[strategy, budget][0][5]
  first = next(iter(outcomes.values()))
  assert 10 < first[0].sum() < 54
  for key, (cut, tokens) in outcomes.items():
    np.testing.assert_array_equal(cut, first[0], err_msg=str(key))
    np.testing.assert_array_equal(tokens, first[1], err_msg=str(key))


def test_xtc_falls_back_when_the_threshold_reaches_beyond_the_candidates():
  """16 candidates of a flat row of 1000: every token reaches threshold 0.0005, so the
  candidates cannot count them; the full path removes all but the last."""
  x = np.random.default_rng(1).normal(0, 0.1, 1000).astype(np.float32)
  sampler = jsample.chain(jsample.xtc(1.0, 0.0005), jsample.temperature(1.0), budget=16)
  state = sampler.init(seed=0)
  assert not bool(jsample.testing.settled_on_candidates(sampler, jnp.asarray(x), state))
  probs = np.asarray(sampler.probs(jnp.asarray(x), state))
  assert np.count_nonzero(probs) == 1 and probs[np.argmin(x)] == 1


def test_min_keep_is_shared_and_must_be_declared_alike():
  """One min_keep per row for every stage that takes it, as llama.cpp passes one to all."""
  sampler = jsample.chain(jsample.typical(0.5), jsample.xtc(0.5), jsample.temperature(1.0))
  assert list(sampler.settings).count("min_keep") == 1
  state = sampler.init(seed=0, min_keep=3)
  assert int(state.settings["min_keep"]) == 3
  x = jnp.asarray(ROW)
  both = jsample.chain(jsample.typical(0.05), jsample.xtc(1.0, 0.12), budget=4)
  for least, survivors in ((0, 1), (3, 3)):  # typical keeps min_keep; XTC would leave 1 < 3: it abstains
    probs = both.probs(x, both.init(seed=0, min_keep=least))
    assert np.count_nonzero(probs) == survivors, least
  for least, survivors in ((5, 5), (6, 7)):  # typical off; XTC acts only if min_keep tokens remain
    probs = both.probs(x, both.init(seed=0, typical_p=1.0, min_keep=least))
    assert np.count_nonzero(probs) == survivors, least
  with pytest.raises(ValueError, match="'typical' and 'xtc' both declare the setting 'min_keep'.*default"):
    jsample.chain(jsample.typical(0.5, min_keep=2), jsample.xtc(0.5, min_keep=3))
