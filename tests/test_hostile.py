"""Hostile inputs: each has a documented outcome (README, "Guarantees and limits").

Either a clear ``ValueError`` at construction or trace time, or a defined
in-range result (``Draw.valid`` says whether anything survived): never NaN,
never a crash, never an id outside ``[0, V)``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from tests.helpers import PENALTIES_OFF

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


PADDED = 24  # every [B, V] batch below is padded to this many rows: one compilation per recipe


@functools.cache
def compiled(recipe, candidates: int = 4):
  """The recipe's sampler and ``run(x, state, mask=None) -> (probs, Draw)`` on ``[B, V]``."""
  sampler = recipe(window_size=WINDOW, budget=candidates)
  both = jax.jit(lambda x, state, mask: (sampler.probs(x, state, mask), sampler.pick_with_info(x, state, mask)[0]))

  def run(x, state, mask=None):
    rows = len(x)

    def pad(a):
      a = jnp.asarray(a)
      return jnp.concatenate([a, jnp.broadcast_to(a[:1], (PADDED - rows, *a.shape[1:]))])

    padded = both(pad(x), jax.tree.map(pad, state), None if mask is None else pad(mask))
    return jax.tree.map(lambda a: np.asarray(a)[:rows], padded)

  return sampler, run


def with_rows(sampler, state, per_row: list[dict]):
  """``state`` with row ``i``'s settings overridden by ``per_row[i]``, unchecked (as under jit)."""
  settings = {name: np.array(value) for name, value in state.settings.items()}
  for i, values in enumerate(per_row):
    for name, value in values.items():
      settings[name][i] = value
  return state._replace(settings={name: jnp.asarray(v) for name, v in settings.items()})


def traced_cases(recipe, cases):
  sampler, _ = compiled(recipe)
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
  _, run = compiled(recipe)
  got, drawn = run(x, bad)
  survivors = run(x, good)[0] > 0
  if recipe is jsample.llama_cpp:  # temperature last: truncation saw the untempered row
    expected = survivors / survivors.sum(-1, keepdims=True)
  else:  # temperature first: every token ties, top-p keeps the crossing prefix of ids
    expected = got > 0
    expected = expected / expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  assert np.all(drawn.valid) and np.all(np.isfinite(drawn.logprob))


@pytest.mark.parametrize("recipe", [jsample.llama_cpp, jsample.hf])
def test_traced_settings_out_of_range_act_as_documented(recipe):
  sampler, x, bad, good = traced_cases(recipe, TRACED)
  _, run = compiled(recipe)
  (got, drawn), (expected, expected_draw) = run(x, bad), run(x, good)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(got, expected, atol=1e-6)
  assert np.all(drawn.valid) and np.all(np.isfinite(drawn.logprob))
  np.testing.assert_array_equal(drawn.token, expected_draw.token)


# -- logits the penalties push out of range --------------------------------------


def test_penalties_never_push_a_logit_to_infinity_or_nan():
  """Row 0: a +inf logit (the largest float) divided by a repeat penalty below 1.
  Row 1: a presence penalty of -3e38 on a logit of 3e38. Row 2: a frequency penalty
  of -3e38 seen twice (-inf) on a masked token, which must stay masked. Rows 3-4:
  a repeat penalty of 1e-38 and a frequency penalty of 3e38 seen twice (inf - inf)."""
  sampler, run = compiled(jsample.llama_cpp)
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
  probs, drawn = run(x, state)
  assert np.all(np.isfinite(probs)) and np.all(np.isfinite(drawn.logprob))
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.asarray(drawn.valid))
  np.testing.assert_array_equal(drawn.token[:2], [5, 5])  # the raised token is certain
  assert probs[2, 5] == 0  # masked stays masked
  assert probs[3, 5] == 0  # inf - inf counts as removed
  assert probs[4, 5] == 1  # 1 / 1e-38 stops at the largest float: certain


# -- +inf logits: the largest float ------------------------------------------------


@pytest.mark.parametrize(
  "stages, candidates",
  [
    ((), 128),
    ((jsample.top_k(0),), 128),
    ((jsample.top_k(0),), 2),  # 4 ties > 2 candidates: the full-vocabulary path
    ((jsample.min_p(0.5), jsample.temperature(1.0)), 128),
  ],
  ids=["bare", "top_k", "top_k, full path", "min_p"],
)
def test_several_positive_infinities_share_the_draw(stages, candidates):
  """+inf is the largest float, so +inf tokens tie: each is drawn equally often,
  whatever the chain and path; near that float, log Σ exp rounds to the largest logit."""
  sampler = jsample.chain(*stages, budget=candidates)
  x = jnp.array([np.inf, 1.0, np.inf, F32_MAX, -np.inf, np.inf])
  probs = np.asarray(sampler.probs(x, sampler.init(seed=0)))
  np.testing.assert_allclose(probs, [0.25, 0, 0.25, 0.25, 0, 0.25], atol=1e-7)
  draw = jax.jit(jax.vmap(lambda state: sampler.pick_with_info(x, state)[0]))
  drawn = draw(sampler.init(seed=np.arange(400)))
  np.testing.assert_allclose(drawn.logprob, np.log(0.25), rtol=1e-6)
  counts = np.bincount(np.asarray(drawn.token), minlength=6)
  assert counts[[1, 4]].sum() == 0 and counts.min(initial=400, where=probs > 0) > 60, counts


# -- rows of unusual values --------------------------------------------------------

RECIPES = [jsample.llama_cpp, jsample.gemma, jsample.hf]


def test_huge_magnitudes_and_subnormals():
  """1e30 logits sample like any others (here: one-hot, as their gaps are huge);
  subnormal logits count as 0 (XLA flushes them on CPU) on both paths."""
  sampler, run = compiled(jsample.llama_cpp)
  rng = np.random.default_rng(2)
  x = np.stack([rng.normal(size=V) * 1e30, -np.abs(rng.normal(size=V)) * 1e30, np.zeros(V), np.zeros(V)])
  x[2, 5], x[2, 9], x[3, 5] = 1e-45, -1e-45, 1e-44
  x = x.astype(np.float32)
  state = sampler.init(seed=np.arange(4), top_k=[0, 40, 0, 3], top_p=1.0, min_p=0.0, temperature=[1.0, 0.5, 1.0, 1.0])
  probs, drawn = run(x, state)
  assert np.all(np.isfinite(probs)) and np.all(drawn.valid)
  np.testing.assert_array_equal(drawn.token[:2], np.argmax(x[:2], axis=1))
  np.testing.assert_array_equal(probs[:2], np.eye(V)[np.argmax(x[:2], axis=1)])
  np.testing.assert_allclose(probs[2], np.full(V, 1 / V), rtol=1e-6)  # all tie at 0
  np.testing.assert_allclose(probs[3, :3], 1 / 3, rtol=1e-6)  # top-3 of ties: the lowest ids


@pytest.mark.parametrize("candidates", [4, 64], ids=["full path", "candidate path"])
def test_bfloat16_rows_of_exact_ties_go_to_the_lower_ids(candidates):
  sampler = jsample.llama_cpp(window_size=WINDOW, budget=candidates)
  x = jnp.full((4, 1000), 1.5, jnp.bfloat16)
  state = sampler.init(seed=np.arange(4), temperature=[0.0, 1.0, 1.0, 1.0], top_k=[0, 3, 0, 0], top_p=[1, 1, 0.25, 1])
  probs, tokens = jax.jit(lambda x, state: (sampler.probs(x, state), sampler.pick(x, state)[0]))(x, state)
  probs, tokens = np.asarray(probs), np.asarray(tokens)
  assert np.flatnonzero(probs[0]).tolist() == [0]
  assert np.flatnonzero(probs[1]).tolist() == [0, 1, 2]
  assert np.flatnonzero(probs[2]).tolist() == list(range(250))
  np.testing.assert_allclose(probs[3], 1 / 1000, rtol=1e-5)
  assert tokens[0] == 0 and tokens[1] < 3 and tokens[2] < 250


@pytest.mark.parametrize(
  "recipe, mask",
  [(recipe, None) for recipe in RECIPES]
  + [(jsample.llama_cpp, mask) for mask in ("bool", "packed", "packed, tail bits set", "packed, none allowed")],
)
def test_a_vocabulary_of_one(recipe, mask):
  sampler = recipe(window_size=WINDOW)
  allowed = {
    None: None,
    "bool": jnp.ones((3, 1), bool),
    "packed": jnp.ones((3, 1), jnp.int32),
    "packed, tail bits set": jnp.full((3, 1), -1, jnp.int32),
    "packed, none allowed": jnp.full((3, 1), -2, jnp.int32),  # every bit but token 0's
  }[mask]
  state = sampler.init(seed=[0, 1, 2], prompt=[[0, 0], [], [0]], temperature=[0.0, 1.0, 1e9], repeat_penalty=1.5)
  drawn, after = jax.jit(sampler.pick_with_info)(jnp.array([[0.5], [-3.0], [1e30]]), state, allowed)
  np.testing.assert_array_equal(drawn.token, [0, 0, 0])
  np.testing.assert_array_equal(drawn.valid, [mask != "packed, none allowed"] * 3)
  np.testing.assert_array_equal(drawn.logprob, [0.0, 0.0, 0.0])


@pytest.mark.parametrize("vocab", [33, 1000])
def test_packed_tail_bits_past_the_vocabulary_are_ignored(vocab):
  """Bits of the last word past ``V`` may hold anything (grammar engines leave them set)."""
  sampler = jsample.llama_cpp(window_size=WINDOW, budget=4, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)
  x = jnp.asarray(np.random.default_rng(vocab).normal(size=(3, vocab)), jnp.float32)
  allowed = np.zeros((3, vocab), bool)
  allowed[0, -1] = True  # only the last token
  allowed[1, :3] = True
  clear = np.asarray(jsample.pack_mask(allowed))
  dirty = clear.copy()
  dirty[:, -1] |= ~np.int32(0) << np.int32(vocab % 32) if vocab % 32 else 0
  state = sampler.init(seed=[1, 2, 3])
  both = jax.jit(lambda x, state, mask: (sampler.probs(x, state, mask), sampler.pick(x, state, mask)[0]))
  (probs, tokens), (expected, expected_tokens) = both(x, state, dirty), both(x, state, clear)
  np.testing.assert_array_equal(probs, expected)
  np.testing.assert_array_equal(tokens, expected_tokens)
  assert int(tokens[0]) == vocab - 1


@pytest.mark.parametrize(
  "recipe, mask, vocab",
  [(recipe, None, V) for recipe in RECIPES]
  + [(jsample.llama_cpp, "bool", V), (jsample.llama_cpp, "packed", V)]
  # A vocabulary over budget x 32 takes the chunked top-k, whose reshapes must not infer a size from 0 rows.
  + [(jsample.gemma, None, 20000), (jsample.llama_cpp, "packed", 20000)],
)
def test_a_batch_of_no_rows(recipe, mask, vocab):
  sampler = recipe(window_size=WINDOW)
  state = sampler.init(seed=np.zeros(0, np.int64), prompt=np.zeros((0, 3), np.int32))
  allowed = {None: None, "bool": jnp.ones((0, vocab), bool), "packed": jsample.pack_mask(jnp.ones((0, vocab), bool))}
  x = jnp.zeros((0, vocab))
  both = jax.jit(lambda x, state, mask: (sampler.probs(x, state, mask), sampler.pick_with_info(x, state, mask)))
  probs, (drawn, after) = both(x, state, allowed[mask])
  assert drawn.token.shape == (0,) and after.window.shape == (0, WINDOW) and probs.shape == (0, vocab)
  assert jsample.unpack_mask(allowed["packed"], vocab).shape == (0, vocab)
  assert sampler.init(batch=0).position.shape == (0,)


@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_an_empty_vocabulary_is_refused(shape):
  sampler = jsample.llama_cpp()
  state = sampler.init(seed=np.zeros(shape[:-1], np.int64))
  with pytest.raises(ValueError, match="vocabulary"):
    jax.jit(sampler.pick)(jnp.zeros(shape), state)


def test_extreme_temperatures():
  """1e-9 is greedy wherever the best logit is unique; 1e9 is uniform over the survivors."""
  sampler, run = compiled(jsample.llama_cpp)
  x = np.random.default_rng(3).normal(size=(4, V)).astype(np.float32)
  state = sampler.init(seed=np.arange(4), temperature=[1e-9, 1e-9, 1e9, 1e9], top_k=[0, 5, 0, 5], top_p=1.0, min_p=0.0)
  probs, drawn = run(x, state)
  np.testing.assert_array_equal(probs[:2], np.eye(V)[np.argmax(x[:2], axis=1)])
  np.testing.assert_allclose(probs[2], 1 / V, rtol=1e-5)
  top5 = np.argsort(-x[3])[:5]
  np.testing.assert_allclose(probs[3, top5], 0.2, rtol=1e-5)
  np.testing.assert_array_equal(drawn.token[:2], np.argmax(x[:2], axis=1))


# -- window and prompt ids outside the vocabulary, under jit -----------------------


def test_traced_ids_outside_the_vocabulary_are_ignored():
  """Without ``vocab_size``, or under ``jit``, ids cannot be refused: a prompt id
  below 0 is skipped like the -1 padding, and window ids outside [0, V) count
  for no token (penalties ignore them). ``Sampler.checked`` reports them."""
  sampler, run = compiled(jsample.llama_cpp)
  x = np.random.default_rng(4).normal(size=(2, V)).astype(np.float32)
  best = int(np.argmax(x[0]))
  settings = dict(repeat_penalty=3.0, frequency_penalty=1.0, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)
  seed = jax.jit(sampler.load_prompt)
  clean = seed(jnp.array([[best, -1, -1, -1], [best, best, -1, -1]]), sampler.init(seed=[5, 6], **settings))
  hostile = seed(jnp.array([[best, -5, V, V + 99], [-7, best, best, 2**30]]), sampler.init(seed=[5, 6], **settings))
  accepted = jax.jit(sampler.accept)(jnp.array([-3, V + 1]), hostile)
  clean = jax.jit(sampler.accept)(jnp.array([-1, -1]), clean)  # an empty slot, as for an empty row
  probs, _ = run(x, accepted)
  expected, _ = run(x, clean)
  np.testing.assert_allclose(probs, expected, atol=1e-7)
  assert np.asarray(probs)[0, best] < 1 / V  # the real id was penalised


# -- known limits (README): each fails until it is lifted ---------------------------


@pytest.mark.xfail(strict=True, reason="top-p before temperature: log-sum-exp rounds at the largest float")
def test_top_p_among_ties_at_the_largest_float():
  sampler = jsample.llama_cpp(top_k=0, top_p=0.5, min_p=0.0, temperature=1.0)
  x = jnp.array([np.inf] * 4 + [0.0] * 4)
  probs = np.asarray(jax.jit(sampler.probs)(x, sampler.init(seed=0)))
  np.testing.assert_allclose(probs, [0.5, 0.5, 0, 0, 0, 0, 0, 0])  # today: [1, 0, ...]


@pytest.mark.xfail(strict=True, reason="temperature-first chains: float32 ties that temperature creates")
def test_ties_created_by_temperature_in_a_temperature_first_chain():
  """At t = 3e38 every tempered gap underflows: the full-vocabulary path sees ties
  (broken by id), the candidate path keeps the untempered order."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=200), jnp.float32)
  kept = []
  for candidates in (2, 256):  # top-k 3 > 2 candidates: the full path
    sampler = jsample.hf(budget=candidates, window_size=4)
    state = sampler.init(seed=0, temperature=3e38, top_k=3)
    kept.append(np.flatnonzero(jax.jit(sampler.probs)(x, state)).tolist())
  assert kept[0] == kept[1]


def test_strict_promotion_is_in_force():
  """tests/conftest.py: a silent [B] x [B, V] broadcast or dtype promotion fails every test."""
  with pytest.raises(ValueError, match="jax_numpy_rank_promotion"):
    jnp.ones(3) + jnp.ones((2, 3))
  with pytest.raises(jax.dtypes.TypePromotionError):
    jnp.ones(3, jnp.bfloat16) + jnp.ones(3, jnp.float32)
