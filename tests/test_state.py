"""The sampler state: init, seed, accept, configure, and the window the penalties read."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from tests.helpers import EACH_STRATEGY, NEUTRAL_PENALTIES

W = 4
V = 8
ROWS = 8
SAMPLER = jsample.llama_cpp(window_size=W)
PICK = jax.jit(SAMPLER.pick)  # every pick below is [ROWS, V] float32: one compilation


def ring(tokens, width=W):
  """The expected window after ``tokens`` (-1 skipped): token number n at n % width."""
  tokens = [t for t in tokens if t >= 0]
  window = np.full(width, -1, np.int32)
  for n, t in enumerate(tokens[-width:] if width else [], start=max(0, len(tokens) - width)):
    window[n % width] = t
  return window


def key_data(state):
  return np.asarray(jax.random.key_data(state.key))


def assert_same_state(a, b):
  np.testing.assert_array_equal(key_data(a), key_data(b))
  np.testing.assert_array_equal(a.position, b.position)
  np.testing.assert_array_equal(a.window, b.window)
  assert a.settings.keys() == b.settings.keys()
  for name in a.settings:
    np.testing.assert_array_equal(a.settings[name], b.settings[name], err_msg=name)


# -- init ----------------------------------------------------------------------


def test_init_scalar_settings_give_one_row():
  state = SAMPLER.init(seed=3, temperature=0.5, top_k=7)
  assert jax.dtypes.issubdtype(state.key.dtype, jax.dtypes.prng_key)
  assert state.key.shape == ()
  assert state.position.shape == () and state.position.dtype == jnp.int32 and int(state.position) == 0
  assert state.window.shape == (W,) and state.window.dtype == jnp.int32
  np.testing.assert_array_equal(state.window, -1)
  assert set(state.settings) == set(SAMPLER.settings)
  for name, setting in SAMPLER.settings.items():
    assert state.settings[name].shape == setting.shape, name  # vector settings keep their [N]
    assert state.settings[name].dtype == setting.dtype, name
  assert float(state.settings["temperature"]) == 0.5
  assert int(state.settings["top_k"]) == 7
  np.testing.assert_array_equal(key_data(state), jax.random.key_data(jax.random.key(3)))


@pytest.mark.parametrize(
  "kwargs, rows",
  [
    (dict(seed=[1, 2, 3]), 3),
    (dict(top_p=[0.9, 0.8]), 2),
    (dict(seed=5, temperature=np.array([0.1, 0.2, 0.3, 0.4])), 4),
    (dict(seed=np.arange(2), min_p=0.1, top_k=[1, 2]), 2),
    (dict(prompt=[[1, 2], [3]]), 2),
    (dict(batch=4), 4),
    (dict(batch=1), 1),
    (dict(batch=3, seed=7, top_p=0.5), 3),
  ],
)
def test_init_per_row_values_give_a_batch(kwargs, rows):
  state = SAMPLER.init(**kwargs)
  assert state.key.shape == (rows,)
  assert state.position.shape == (rows,) and state.position.dtype == jnp.int32
  assert state.window.shape == (rows, W) and state.window.dtype == jnp.int32
  for name, setting in SAMPLER.settings.items():
    shape = (rows, *setting.shape)  # vector settings (logit-bias ids, DRY breakers) keep their [N]
    assert state.settings[name].shape == shape, name
    assert state.settings[name].dtype == setting.dtype, name
    given = kwargs.get(name, setting.default)
    np.testing.assert_allclose(state.settings[name], np.broadcast_to(np.asarray(given, np.float32), shape), rtol=1e-6)
  seeds = np.broadcast_to(kwargs.get("seed", 0), (rows,))
  for row, seed in enumerate(seeds):
    np.testing.assert_array_equal(key_data(state)[row], jax.random.key_data(jax.random.key(int(seed))))


def test_init_with_typed_keys():
  one = SAMPLER.init(key=jax.random.key(7))
  assert one.key.shape == () and one.position.shape == ()
  np.testing.assert_array_equal(key_data(one), key_data(SAMPLER.init(seed=7)))
  keys = jax.random.split(jax.random.key(0), ROWS)
  many = SAMPLER.init(key=keys, temperature=1.0)
  assert many.key.shape == (ROWS,) and many.window.shape == (ROWS, W)
  np.testing.assert_array_equal(key_data(many), jax.random.key_data(keys))
  # One key broadcast over a batch, and key= draws exactly as the equivalent seed=.
  shared = SAMPLER.init(key=jax.random.key(9), batch=3)
  np.testing.assert_array_equal(key_data(shared), np.stack([jax.random.key_data(jax.random.key(9))] * 3))
  seeds = np.arange(ROWS) * 17 + 1
  by_key = SAMPLER.init(key=jax.vmap(jax.random.key)(seeds), temperature=2.0, top_k=0, top_p=1.0, min_p=0.0)
  by_seed = SAMPLER.init(seed=seeds, temperature=2.0, top_k=0, top_p=1.0, min_p=0.0)
  logits = jnp.zeros((ROWS, V))
  a, _ = PICK(logits, by_key)
  b, _ = PICK(logits, by_seed)
  np.testing.assert_array_equal(a, b)
  assert len(set(np.asarray(a).tolist())) > 1  # different keys, different streams


@pytest.mark.parametrize(
  "recipe, defaults",
  [
    (jsample.llama_cpp, dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)),
    (jsample.gemma, dict(temperature=1.0, top_k=64, top_p=0.95, min_p=0.05)),
    (jsample.hf, dict(temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)),
  ],
)
def test_recipe_defaults(recipe, defaults):
  sampler = recipe()
  assert sampler.window_size == 64
  state = sampler.init(seed=0)
  assert state.window.shape == (64,)
  # Dynamic temperature is llama.cpp's alone: the other recipes' programs leave it out.
  dynatemp_off = dict(dynatemp_range=0.0, dynatemp_exponent=1.0) if recipe is jsample.llama_cpp else {}
  assert bool(dynatemp_off) == ("dynatemp_range" in state.settings)
  # Every other stage of the recipe is neutral by default (tests/test_recipes.py checks the orders).
  assert set(defaults) | set(NEUTRAL_PENALTIES) | set(dynatemp_off) <= set(state.settings)
  off = dict(dry_multiplier=0.0, top_n_sigma=-1.0, typical_p=1.0, xtc_probability=0.0, mirostat=0)
  off.update(epsilon_cutoff=0.0, eta_cutoff=0.0, logit_bias_ids=-1, banned_token_ids=-1, min_tokens=0)
  for name, value in off.items():
    if name in state.settings:
      np.testing.assert_array_equal(state.settings[name], np.broadcast_to(value, state.settings[name].shape), name)
  for name, value in {**defaults, **NEUTRAL_PENALTIES, **dynatemp_off}.items():
    np.testing.assert_allclose(state.settings[name], value, rtol=1e-7, err_msg=name)


def test_recipe_overrides():
  sampler = jsample.gemma(temperature=0.3, top_k=5, window_size=16)
  state = sampler.init(seed=0)
  assert state.window.shape == (16,)
  assert float(state.settings["temperature"]) == pytest.approx(0.3)
  assert int(state.settings["top_k"]) == 5
  assert float(state.settings["top_p"]) == pytest.approx(0.95)
  assert float(sampler.init(seed=0, temperature=1.5).settings["temperature"]) == 1.5


# -- seed ----------------------------------------------------------------------


def test_seed_keeps_the_last_w_tokens():
  lengths = range(2 * W + 2)
  prompts = [list(range(100, 100 + n)) for n in lengths]
  state = SAMPLER.init(seed=0, prompt=prompts)
  np.testing.assert_array_equal(state.position, lengths)
  np.testing.assert_array_equal(state.window, np.stack([ring(p) for p in prompts]))
  window = np.asarray(state.window)
  for length in lengths:  # token number n sits at slot n % W
    for n in range(max(0, length - W), length):
      assert window[length, n % W] == 100 + n
  for length in (3, 2 * W + 1):  # one row, by init and by seed
    one = SAMPLER.init(seed=0, prompt=prompts[length])
    np.testing.assert_array_equal(one.window, ring(prompts[length]))
    assert int(one.position) == length
    assert_same_state(one, SAMPLER.load_prompt(np.asarray(prompts[length], np.int32), SAMPLER.init(seed=0)))


def test_padding_is_skipped_anywhere():
  tokens = [1, 2, 3, 4, 5, 6]
  rows = np.array(
    [
      [-1, -1, 1, 2, 3, 4, 5, 6],  # left-padded
      [1, 2, 3, 4, 5, 6, -1, -1],  # right-padded
      [1, -1, 2, 3, -1, 4, 5, 6],  # holes
      [-1, 1, 2, -1, 3, 4, 5, 6],
    ]
  )
  state = SAMPLER.init(seed=[0, 1, 2, 3], prompt=rows)
  np.testing.assert_array_equal(state.position, len(tokens))
  np.testing.assert_array_equal(state.window, np.stack([ring(tokens)] * 4))
  np.testing.assert_array_equal(state.window[0], SAMPLER.init(seed=0, prompt=tokens).window)


def test_ragged_list_of_lists():
  prompts = [[1, 2, 3, 4, 5, 6], [7], [], [8, 9]]
  state = SAMPLER.init(seed=[0, 1, 2, 3], prompt=prompts)
  np.testing.assert_array_equal(state.position, [6, 1, 0, 2])
  np.testing.assert_array_equal(state.window, np.stack([ring(p) for p in prompts]))
  np.testing.assert_array_equal(state.window, SAMPLER.load_prompt(prompts, SAMPLER.init(batch=4)).window)


def test_1d_prompt_goes_into_every_row():
  prompt = [5, 6, 7, 8, 9]
  for state in (
    SAMPLER.init(seed=[0, 1, 2], prompt=prompt),
    SAMPLER.init(batch=3, prompt=np.asarray(prompt)),
    SAMPLER.load_prompt(jnp.asarray(prompt), SAMPLER.init(top_p=[0.5, 0.6, 0.7])),
  ):
    assert state.position.shape == (3,)
    np.testing.assert_array_equal(state.position, 5)
    np.testing.assert_array_equal(state.window, np.stack([ring(prompt)] * 3))


def test_seeding_twice_appends():
  once = SAMPLER.init(seed=0, prompt=[1, 2, 3])
  twice = SAMPLER.load_prompt([4, 5, 6], once)
  assert_same_state(twice, SAMPLER.init(seed=0, prompt=[1, 2, 3, 4, 5, 6]))
  first = np.array([[1, 2], [3, -1], [-1, -1]])
  second = np.array([[4, 5, 6], [-1, 7, -1], [8, -1, -1]])
  state = SAMPLER.load_prompt(second, SAMPLER.init(seed=[0, 1, 2], prompt=first))
  expected = [[1, 2, 4, 5, 6], [3, 7], [8]]
  np.testing.assert_array_equal(state.position, [5, 2, 1])
  np.testing.assert_array_equal(state.window, np.stack([ring(p) for p in expected]))


def test_load_prompt_under_jit():
  prompt = np.array([[1, 2, 3, 4, 5], [-1, -1, 6, 7, 8]], np.int32)
  state = SAMPLER.init(seed=[0, 1], prompt=[9])
  eager = SAMPLER.load_prompt(prompt, state)
  traced = jax.jit(SAMPLER.load_prompt)(jnp.asarray(prompt), state)
  assert_same_state(eager, traced)
  np.testing.assert_array_equal(traced.window, np.stack([ring([9, 1, 2, 3, 4, 5]), ring([9, 6, 7, 8])]))


# -- accept and pick -----------------------------------------------------------


def test_accept_writes_at_position_mod_w():
  state = SAMPLER.init(seed=0, prompt=[1, 2, 3, 4, 5])
  history = [1, 2, 3, 4, 5]
  accept = jax.jit(SAMPLER.accept)
  for token in range(20, 31):
    before = int(state.position)
    state = accept(token, state)
    history.append(token)
    assert int(state.position) == before + 1
    assert int(state.window[before % W]) == token
    np.testing.assert_array_equal(state.window, ring(history))


def test_accept_batched_rows_at_their_own_positions():
  prompts = [[1, 2, 3], [1], [], [1, 2, 3, 4, 5]]
  state = SAMPLER.init(seed=[0, 1, 2, 3], prompt=prompts)
  tokens = [7, 8, 9, 10]
  state = SAMPLER.accept(jnp.array(tokens), state)
  np.testing.assert_array_equal(state.position, [4, 2, 1, 6])
  np.testing.assert_array_equal(state.window, np.stack([ring(p + [t]) for p, t in zip(prompts, tokens, strict=True)]))


def test_pick_accepts_its_own_token():
  prompts = [[1, 2, 3], [], [4], [5, 6, 7, 0, 1], [2], [3, 3], [], [7]]
  state = SAMPLER.init(seed=np.arange(ROWS), prompt=prompts, temperature=2.0, top_k=0, top_p=1.0, min_p=0.0)
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(ROWS, V)), jnp.float32)
  history = [list(p) for p in prompts]
  for _ in range(2 * W + 1):
    before = np.asarray(state.position)
    tokens, state = PICK(logits, state)
    tokens = np.asarray(tokens)
    np.testing.assert_array_equal(state.position, before + 1)
    np.testing.assert_array_equal(np.asarray(state.window)[np.arange(ROWS), before % W], tokens)
    for row, token in enumerate(tokens):
      history[row].append(int(token))
  np.testing.assert_array_equal(state.window, np.stack([ring(h) for h in history]))
  assert len(set(np.concatenate([h[len(p) :] for h, p in zip(history, prompts, strict=True)]).tolist())) > 1


def test_window_zero():
  sampler = jsample.llama_cpp(window_size=0, temperature=0.0, repeat_penalty=2.0)
  one = sampler.init(seed=0, prompt=[2, 2, 1])
  assert one.window.shape == (0,) and int(one.position) == 3
  state = sampler.init(seed=np.arange(ROWS), prompt=[[2, 2], [1], [], [3]] * 2, penalty_last_n=[-1, 0] * 4)
  assert state.window.shape == (ROWS, 0)
  np.testing.assert_array_equal(state.position, [2, 1, 0, 1] * 2)
  logits = jnp.broadcast_to(jnp.array([0.0, 1.0, 1.5, 0.5, -1.0, -2.0, 0.2, 0.1]), (ROWS, V))
  drawn, state = jax.jit(sampler.pick_with_info)(logits, state)
  np.testing.assert_array_equal(drawn.token, 2)  # nothing to penalise: the argmax
  np.testing.assert_array_equal(state.position, [3, 2, 1, 2] * 2)
  state = sampler.accept(jnp.zeros(ROWS, jnp.int32), state)
  np.testing.assert_array_equal(state.position, [4, 3, 2, 3] * 2)
  assert state.window.shape == (ROWS, 0)
  with pytest.raises(ValueError, match="penalty_last_n"):
    sampler.init(seed=0, penalty_last_n=1)


# -- configure -----------------------------------------------------------------


def test_configure_changes_only_the_values_given():
  state = SAMPLER.init(seed=[4, 5, 6], prompt=[[1, 2, 3], [4], []], top_p=[0.9, 0.8, 0.7])
  state = SAMPLER.accept(jnp.array([5, 6, 7]), state)
  new = SAMPLER.configure(state, temperature=[0.1, 0.2, 0.3], min_p=0.2)
  assert jax.tree.structure(new) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True):
    assert a.shape == b.shape and a.dtype == b.dtype
  expected = state._replace(
    settings={
      **state.settings,
      "temperature": jnp.array([0.1, 0.2, 0.3], jnp.float32),
      "min_p": jnp.full(3, 0.2, jnp.float32),
    }
  )
  assert_same_state(new, expected)
  assert not np.allclose(state.settings["temperature"], new.settings["temperature"])


def test_configure_one_row():
  state = SAMPLER.init(seed=1, prompt=[3, 4])
  new = SAMPLER.configure(state, top_k=3, repeat_penalty=1.5)
  assert_same_state(new, state._replace(settings={**state.settings, "top_k": jnp.int32(3), "repeat_penalty": 1.5}))
  assert new.settings["top_k"].shape == () and new.settings["top_k"].dtype == jnp.int32


def test_configure_under_jit_does_not_recompile():
  configure = jax.jit(lambda state, t: SAMPLER.configure(state, temperature=t))
  state = SAMPLER.init(seed=np.arange(ROWS), temperature=2.0, top_k=0, top_p=1.0, min_p=0.0)
  greedy = configure(state, jnp.zeros(ROWS, jnp.float32))
  np.testing.assert_array_equal(greedy.settings["temperature"], 0.0)
  assert_same_state(greedy, SAMPLER.configure(state, temperature=np.zeros(ROWS, np.float32)))
  logits = jnp.asarray(np.random.default_rng(2).normal(size=(ROWS, V)), jnp.float32)
  traces = []

  def counted(x, state):
    traces.append(1)  # runs once per trace, i.e. per compilation
    return SAMPLER.pick(x, state)

  pick = jax.jit(counted)
  pick(logits, state)
  tokens, _ = pick(logits, greedy)
  assert len(traces) == 1
  np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits), axis=-1))


@pytest.mark.parametrize(
  "settings, name",
  [
    (dict(top_p=0.0), "top_p"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(penalty_last_n=W + 1), "penalty_last_n"),
    (dict(top_k=1.5), "top_k"),
    (dict(typo=1), "typo"),
    (dict(min_p=[0.1, 0.2]), "min_p"),  # the state has 3 rows
  ],
)
def test_configure_validates_like_init(settings, name):
  state = SAMPLER.init(seed=[1, 2, 3])
  with pytest.raises(ValueError, match=name):
    SAMPLER.configure(state, **settings)
  with pytest.raises(ValueError, match=name):
    SAMPLER.init(seed=[1, 2, 3], **settings)


# -- penalties read the prompt -------------------------------------------------

A = [0.0, 1.0, 1.5, 0.5, -1.0, -2.0, 0.2, 0.1]  # argmax 2, runner-up 1
NEGATIVE = [-3.0, -0.8, -0.5, -2.0, -4.0, -4.0, -4.0, -4.0]  # argmax 2 at -0.5, runner-up 1 at -0.8


def test_penalties_use_the_prompt():
  cases = [  # logits, prompt, repeat_penalty, penalty_last_n, expected greedy token
    (A, [2], 2.0, -1, 1),  # 1.5 / 2 = 0.75 < 1.0
    (A, [2], 2.0, 0, 2),  # penalties off
    (A, [2, 5], 2.0, 1, 2),  # only the newest token (5) counts
    (A, [5, 2], 2.0, 1, 1),  # the newest token is 2
    (NEGATIVE, [2], 2.0, -1, 1),  # -0.5 * 2 = -1.0 < -0.8
    (A, [3], 2.0, -1, 2),  # penalising another token changes nothing
    (A, [2], 1.2, -1, 2),  # 1.5 / 1.2 = 1.25 > 1.0: still the best
    (A, [2, 0, 0, 0, 0], 2.0, -1, 2),  # 2 has left the window of 4
  ]
  logits, prompts, repeat, last_n, expected = map(list, zip(*cases, strict=True))
  state = SAMPLER.init(
    seed=np.arange(ROWS), prompt=prompts, temperature=0.0, repeat_penalty=repeat, penalty_last_n=last_n
  )
  tokens, _ = PICK(jnp.asarray(logits, jnp.float32), state)
  np.testing.assert_array_equal(tokens, expected)


def test_drawn_tokens_are_penalised_at_the_next_step():
  state = SAMPLER.init(seed=np.arange(ROWS), temperature=0.0, repeat_penalty=[2.0] * 4 + [1.0] * 4)
  logits = jnp.broadcast_to(jnp.asarray(A, jnp.float32), (ROWS, V))
  first, state = PICK(logits, state)
  second, state = PICK(logits, state)
  np.testing.assert_array_equal(first, 2)
  np.testing.assert_array_equal(second, [1] * 4 + [2] * 4)


@pytest.mark.parametrize("strategy", EACH_STRATEGY)
def test_fork_gives_n_samples_per_row_as_separate_rows_with_derived_streams(strategy):
  """Copy j of row i draws what a row of its own with the key fold_in(key_i, j) draws, step after step."""
  rng = np.random.default_rng(8)
  batch, n, vocab = 3, 4, 400
  sampler = jsample.llama_cpp(strategy=strategy, window_size=8)
  prompt = rng.integers(0, vocab, (batch, 5))
  state = sampler.init(seed=[5, 6, 7], prompt=prompt, temperature=[0.7, 1.2, 1.0], top_k=[0, 40, 10])
  forked = sampler.fork(state, n=n)
  assert forked.position.shape == (batch * n,)
  step = jax.jit(sampler.pick)
  alone = [
    sampler.configure(
      sampler.init(key=jax.random.fold_in(jax.random.key(5 + i), j), prompt=prompt[i]),
      temperature=[0.7, 1.2, 1.0][i],
      top_k=[0, 40, 10][i],
    )
    for i in range(batch)
    for j in range(n)
  ]
  for _ in range(3):
    logits = jnp.asarray(rng.normal(0, 2, (batch, vocab)), jnp.float32)
    tokens, forked = step(jnp.repeat(logits, n, axis=0), forked)
    for r in range(batch * n):
      token, alone[r] = step(logits[r // n], alone[r])
      assert int(token) == int(tokens[r]), r
  assert len(set(tokens.tolist())) > 1  # the copies draw differently


def test_fork_needs_a_positive_count():
  sampler = jsample.llama_cpp()
  with pytest.raises(ValueError, match="n: must be an int >= 1"):
    sampler.fork(sampler.init(seed=0), n=0)
