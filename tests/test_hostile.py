"""Hostile inputs: each has a documented outcome (README, "Guarantees and limits").

Either a clear ``ValueError`` at construction or trace time, or a defined
in-range result (``Draw.valid`` says whether anything survived): never NaN,
never a crash, never an id outside ``[0, V)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample

F32_MAX = float(np.finfo(np.float32).max)


# -- settings that the state's dtype cannot hold ---------------------------------


@pytest.mark.parametrize(
  "settings, name",
  [
    (dict(temperature=1e39), "temperature"),  # float32 overflow: would be +inf
    (dict(frequency_penalty=-1e39), "frequency_penalty"),
    (dict(repeat_penalty=1e-50), "repeat_penalty"),  # rounds to 0, which divides by zero
    (dict(top_k=2**32 + 5), "top_k"),  # int32 wrap: would be 5
    (dict(top_k=np.array([2**40, 3])), "top_k"),  # would wrap to 0, i.e. top-k off
    (dict(top_k=2**31), "top_k"),
  ],
  ids=str,
)
def test_settings_are_checked_as_the_state_holds_them(settings, name):
  sampler = jsample.llama_cpp()
  with pytest.raises(ValueError, match=name):
    sampler.init(seed=[0, 1], **settings)
  with pytest.raises(ValueError, match=name):
    sampler.configure(sampler.init(seed=[0, 1]), **settings)


def test_extreme_settings_that_fit_are_kept_exactly():
  sampler = jsample.llama_cpp()
  state = sampler.init(seed=0, top_k=-(2**31), temperature=F32_MAX, repeat_penalty=1e-38)
  assert int(state.settings["top_k"]) == -(2**31)
  assert float(state.settings["temperature"]) == F32_MAX
  assert float(state.settings["repeat_penalty"]) > 0


# -- settings out of range under jit ----------------------------------------------
#
# init rejects these, but a traced state can hold anything. Each row holds one
# bad value; it must sample exactly like a row with the value it is defined to
# act as.

WINDOW = 8
V = 16
NAN, INF = float("nan"), float("inf")
BASE = dict(temperature=1.0, top_k=0, top_p=0.9, min_p=0.05, repeat_penalty=1.3, frequency_penalty=0.2)
PENALTIES_OFF = dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
TRACED = [
  (dict(repeat_penalty=0.0), PENALTIES_OFF),
  (dict(repeat_penalty=NAN), PENALTIES_OFF),
  (dict(repeat_penalty=-1.0), PENALTIES_OFF),
  (dict(repeat_penalty=INF), PENALTIES_OFF),
  (dict(frequency_penalty=NAN), PENALTIES_OFF),
  (dict(frequency_penalty=-INF), PENALTIES_OFF),
  (dict(presence_penalty=-INF), PENALTIES_OFF),
  (dict(presence_penalty=INF), PENALTIES_OFF),
  (dict(temperature=NAN), dict(temperature=0.0)),
  (dict(temperature=-INF), dict(temperature=0.0)),
  (dict(top_p=NAN), dict(top_p=1.0)),
  (dict(top_p=INF), dict(top_p=1.0)),
  (dict(top_p=-1.0), dict(top_p=1e-30)),  # keeps the best token
  (dict(top_p=0.0), dict(top_p=1e-30)),
  (dict(min_p=NAN), dict(min_p=0.0)),
  (dict(min_p=-INF), dict(min_p=0.0)),
  (dict(min_p=INF), dict(min_p=1.0)),
  (dict(min_p=7.0), dict(min_p=1.0)),
  (dict(penalty_last_n=-7), dict(penalty_last_n=-1)),
  (dict(penalty_last_n=1000), dict(penalty_last_n=WINDOW)),
  (dict(top_k=2**31 - 1), dict(top_k=0)),
]


def with_rows(sampler, state, per_row: list[dict]):
  """``state`` with row ``i``'s settings overridden by ``per_row[i]``, unchecked (as under jit)."""
  settings = {name: np.array(value) for name, value in state.settings.items()}
  for i, values in enumerate(per_row):
    for name, value in values.items():
      settings[name][i] = value
  return state._replace(settings={name: jnp.asarray(v) for name, v in settings.items()})


def traced_cases(recipe, cases):
  sampler = recipe(window=WINDOW, candidates=4)
  rng = np.random.default_rng(0)
  x = (3 * rng.normal(size=(len(cases), V))).astype(np.float32)
  best = np.argsort(-x, axis=1)[:, :3]
  state = sampler.init(seed=np.arange(len(cases)), prompt=np.concatenate([best, best[:, :1]], axis=1), **BASE)
  bad = with_rows(sampler, state, [case for case, _ in cases])
  good = with_rows(sampler, state, [equivalent for _, equivalent in cases])
  return sampler, jnp.asarray(x), bad, good


@pytest.mark.parametrize("recipe", [jsample.llama_cpp, jsample.hf])
def test_traced_infinite_temperature_is_uniform_over_the_survivors(recipe):
  cases = [(dict(temperature=INF, top_p=p), dict(temperature=1.0, top_p=p)) for p in (1.0, 0.9, 0.5, 1e-30)]
  sampler, x, bad, good = traced_cases(recipe, cases)
  got = np.asarray(jax.jit(sampler.probs)(x, bad))
  survivors = np.asarray(jax.jit(sampler.probs)(x, good)) > 0
  if recipe is jsample.llama_cpp:  # temperature last: truncation saw the untempered row
    expected = survivors / survivors.sum(-1, keepdims=True)
  else:  # temperature first: every token ties, top-p keeps the crossing prefix of ids
    expected = got > 0
    expected = expected / expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  drawn, _ = jax.jit(sampler.draw)(x, bad)
  assert np.all(np.asarray(drawn.valid)) and np.all(np.isfinite(drawn.logprob))


@pytest.mark.parametrize("recipe", [jsample.llama_cpp, jsample.hf])
def test_traced_settings_out_of_range_act_as_documented(recipe):
  sampler, x, bad, good = traced_cases(recipe, TRACED)
  probs, draw = jax.jit(sampler.probs), jax.jit(sampler.draw)
  got = np.asarray(probs(x, bad))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(got, probs(x, good), atol=1e-6)
  drawn, _ = draw(x, bad)
  assert np.all(np.asarray(drawn.valid)) and np.all(np.isfinite(drawn.logprob))
  np.testing.assert_array_equal(drawn.token, draw(x, good)[0].token)


# -- logits the penalties push out of range --------------------------------------


def test_penalties_never_push_a_logit_to_infinity_or_nan():
  """Row 0: a +inf logit (the largest float) divided by a repeat penalty below 1.
  Row 1: a presence penalty of -3e38 on a logit of 3e38. Row 2: a frequency penalty
  of -3e38 seen twice (-inf) on a masked token, which must stay masked. Rows 3-4:
  a repeat penalty of 1e-38 and a frequency penalty of 3e38 seen twice (inf - inf)."""
  sampler = jsample.llama_cpp(window=WINDOW, candidates=4)
  x = np.tile(np.linspace(2.0, -2.0, V, dtype=np.float32), (5, 1))
  x[0, 5] = np.inf
  x[1, 5] = 3e38
  x[2, 5] = -np.inf
  x[3, 5] = 1.0
  x[4, 5] = 100.0
  state = sampler.init(
    seed=np.arange(5),
    prompt=[[5], [5], [5, 5], [5, 5], [5, 5]],
    repeat_penalty=[0.5, 1.0, 1.0, 1e-38, 1e-38],
    frequency_penalty=[0.0, 0.0, -3e38, 3e38, 0.0],
    presence_penalty=[0.0, -3e38, 0.0, 0.0, 0.0],
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    temperature=1.0,
  )
  probs = np.asarray(jax.jit(sampler.probs)(jnp.asarray(x), state))
  drawn, _ = jax.jit(sampler.draw)(jnp.asarray(x), state)
  assert np.all(np.isfinite(probs)) and np.all(np.isfinite(drawn.logprob))
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.asarray(drawn.valid))
  np.testing.assert_array_equal(drawn.token[:2], [5, 5])  # the raised token is certain
  assert probs[2, 5] == 0  # masked stays masked
  assert probs[3, 5] == 0  # inf - inf counts as removed
  assert probs[4, 5] == 1  # 1 / 1e-38 stops at the largest float: certain


# -- +inf logits: the largest float ------------------------------------------------


@pytest.mark.parametrize("stages", [(), (jsample.top_k(0),), (jsample.min_p(0.5), jsample.temperature(1.0))], ids=str)
def test_several_positive_infinities_share_the_draw(stages):
  """+inf is the largest float, so +inf tokens tie: each is drawn equally often,
  whatever the chain; near that float, log Σ exp rounds to the largest logit."""
  sampler = jsample.chain(*stages)
  x = jnp.array([np.inf, 1.0, np.inf, F32_MAX, -np.inf, np.inf])
  probs = np.asarray(sampler.probs(x, sampler.init(seed=0)))
  np.testing.assert_allclose(probs, [0.25, 0, 0.25, 0.25, 0, 0.25], atol=1e-7)
  draw = jax.jit(jax.vmap(lambda state: sampler.draw(x, state)[0]))
  drawn = draw(sampler.init(seed=np.arange(400)))
  np.testing.assert_allclose(drawn.logprob, np.log(0.25), rtol=1e-6)
  counts = np.bincount(np.asarray(drawn.token), minlength=6)
  assert counts[[1, 4]].sum() == 0 and counts.min(initial=400, where=probs > 0) > 60, counts
