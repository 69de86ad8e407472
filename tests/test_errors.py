"""Bad input gets a clear error naming the argument, never a silent wrong token.

Static mistakes (values of settings, shapes and dtypes) raise ``ValueError`` at
construction or at trace time; traced values that cannot raise (NaN or empty
rows under ``jit``) give a flagged, in-range result that leaves other rows alone.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample

NAN, INF = float("nan"), float("inf")
WINDOW = 8
V = 16


def sampler(**kwargs):
  return jsample.llama_cpp(window_size=WINDOW, **kwargs)


# -- settings, at init and configure --------------------------------------------

BAD_SETTINGS = [
  (dict(top_p=0.0), "top_p"),
  (dict(top_p=-0.1), "top_p"),
  (dict(top_p=1.5), "top_p"),
  (dict(top_p=[0.9, 0.0]), "top_p"),  # one bad row is enough
  (dict(temperature=NAN), "temperature"),
  (dict(temperature=[0.5, INF]), "temperature"),
  (dict(min_p=INF), "min_p"),
  (dict(min_p=-0.1), "min_p"),
  (dict(min_p=1.5), "min_p"),
  (dict(repeat_penalty=NAN), "repeat_penalty"),
  (dict(repeat_penalty=0.0), "repeat_penalty"),
  (dict(repeat_penalty=-1.0), "repeat_penalty"),
  (dict(frequency_penalty=-INF), "frequency_penalty"),
  (dict(presence_penalty=NAN), "presence_penalty"),
  (dict(top_k=2.5), "top_k"),
  (dict(penalty_last_n=-2), "penalty_last_n"),
  (dict(penalty_last_n=WINDOW + 1), "penalty_last_n"),
  (dict(penalty_last_n=1.5), "penalty_last_n"),
  (dict(top_q=0.9), "top_q"),
  (dict(temperature="0.5"), "temperature"),
  (dict(top_p=[[0.9, 0.8]]), "top_p"),  # 2-D
]


@pytest.mark.parametrize("settings, name", BAD_SETTINGS, ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_init_rejects_bad_setting(settings, name):
  with pytest.raises(ValueError, match=name):
    sampler().init(seed=0, **settings)


@pytest.mark.parametrize("settings, name", BAD_SETTINGS, ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_configure_rejects_bad_setting(settings, name):
  s = sampler()
  state = s.init(seed=[0, 1])
  with pytest.raises(ValueError, match=name):
    s.configure(state, **settings)


@pytest.mark.parametrize(
  "kwargs, names",
  [
    (dict(seed=[0, 1, 2], top_p=[0.9, 0.8]), ["seed", "top_p"]),
    (dict(seed=[0, 1, 2], batch=2), ["seed", "batch"]),
    (dict(temperature=[0.1, 0.2], prompt=[[1], [2], [3]]), ["temperature", "prompt"]),
    (dict(key=jax.random.split(jax.random.key(0), 3), min_p=[0.1, 0.2]), ["key", "min_p"]),
  ],
)
def test_init_rejects_disagreeing_batch_sizes(kwargs, names):
  with pytest.raises(ValueError, match="batch sizes") as raised:
    sampler().init(**kwargs)
  for name in names:
    assert name in str(raised.value)


def test_init_rejects_2d_seed():
  with pytest.raises(ValueError, match="seed"):
    sampler().init(seed=[[0, 1], [2, 3]])


def test_init_rejects_seed_and_key():
  with pytest.raises(ValueError, match="seed") as raised:
    sampler().init(seed=1, key=jax.random.key(1))
  assert "key" in str(raised.value)


def test_configure_rejects_batch_that_differs_from_state():
  s = sampler()
  with pytest.raises(ValueError, match="top_p"):
    s.configure(s.init(seed=[0, 1, 2]), top_p=[0.9, 0.8])


def test_configure_rejects_rows_on_unbatched_state():
  s = sampler()
  with pytest.raises(ValueError, match="top_p"):
    s.configure(s.init(seed=0), top_p=[0.9, 0.8])


def test_init_rejects_raw_uint32_key():
  with pytest.raises(ValueError, match="key"):
    sampler().init(key=jax.random.PRNGKey(0))


@pytest.mark.parametrize(
  "build, name",
  [
    (lambda: jsample.llama_cpp(temperature=NAN), "temperature"),
    (lambda: jsample.llama_cpp(top_p=0.0), "top_p"),
    (lambda: jsample.gemma(min_p=2.0), "min_p"),
    (lambda: jsample.llama_cpp(penalty_last_n=100, window_size=WINDOW), "penalty_last_n"),
    (lambda: jsample.chain(jsample.top_p(1.5)), "top_p"),
    (lambda: jsample.chain(jsample.penalties(repeat=0.0)), "repeat_penalty"),
  ],
)
def test_bad_defaults_are_rejected_by_construction_or_init(build, name):
  with pytest.raises(ValueError, match=name):
    build().init(seed=0)


# -- building a chain ----------------------------------------------------------


@pytest.mark.parametrize(
  "build, name",
  [
    (lambda: jsample.chain(jsample.top_k(), window_size=-1), "window_size"),
    (lambda: jsample.llama_cpp(window_size=-1), "window_size"),
    (lambda: jsample.chain(jsample.top_k(), budget=0), "budget"),
    (lambda: jsample.llama_cpp(budget=0), "budget"),
    (lambda: jsample.chain(jsample.top_k(), vocab_size=0), "vocab_size"),
    (lambda: jsample.chain(jsample.top_k(), "top_p"), "stages"),
    (lambda: jsample.chain(jsample.top_k, jsample.temperature()), "stages"),
    (lambda: jsample.chain(jsample.top_k(2), jsample.top_k(3)), "top_k"),
    (lambda: jsample.chain(jsample.penalties(), jsample.temperature(), jsample.penalties()), "repeat_penalty"),
  ],
)
def test_chain_rejects(build, name):
  with pytest.raises(ValueError, match=name):
    build()


# -- prompts -------------------------------------------------------------------


@pytest.mark.parametrize(
  "prompt",
  [
    [3, -2, 4],
    [[1, 2], [3, -7]],
    [3, V],
    np.array([[0, V + 5]]),
    np.array([1.0, 2.0]),
    np.array([[1.0, 2.0]], np.float32),
    np.array([True, False]),
    np.zeros((2, 2, 2), np.int32),
  ],
  ids=["below -1", "below -1 in a row", ">= V", ">= V in [B, L]", "float", "float [B, L]", "bool", "3-D"],
)
@pytest.mark.parametrize("how", ["init", "seed"])
def test_bad_prompt(prompt, how):
  s = sampler(vocab_size=V)
  state = s.init(seed=[0] * np.shape(prompt)[0] if np.ndim(prompt) == 2 else 0)
  with pytest.raises(ValueError, match="prompt"):
    if how == "init":
      s.init(seed=0, prompt=prompt)
    else:
      s.load_prompt(prompt, state)


def test_ids_up_to_vocab_size_are_fine():
  state = sampler(vocab_size=V).init(seed=0, prompt=[0, V - 1, -1])
  assert int(state.position) == 2


@pytest.mark.parametrize("prompt", [[1.5, 2.7], [[1.5], [2.0, 3.2]]], ids=["list", "list of lists"])
def test_float_list_prompt_is_rejected(prompt):
  with pytest.raises(ValueError, match="prompt"):
    sampler().init(seed=0, prompt=prompt)


def test_nested_3d_list_prompt_is_rejected():
  with pytest.raises(ValueError, match="prompt"):
    sampler().init(seed=0, prompt=[[[1, 2]], [[3, 4]]])


def test_batched_prompt_needs_batched_state():
  s = sampler()
  with pytest.raises(ValueError, match="prompt"):
    s.load_prompt(np.array([[1, 2], [3, 4]]), s.init(seed=0))
  with pytest.raises(ValueError, match="prompt"):
    s.load_prompt([[1, 2], [3]], s.init(seed=0))


# -- inputs of pick, draw and probs --------------------------------------------

B = 2


def _logits(shape=(B, V), dtype=jnp.float32):
  return jnp.zeros(shape, dtype)


BAD_INPUTS = {
  "int logits": (lambda: _logits(dtype=jnp.int32), None, "logits"),
  "bool logits": (lambda: _logits(dtype=jnp.bool_), None, "logits"),
  "3-D logits": (lambda: _logits((B, 1, V)), None, "logits"),
  "0-D logits": (lambda: jnp.float32(0.0), None, "logits"),
  "logits wider than vocab_size": (lambda: _logits((B, V + 1)), None, "logits"),
  "logits batch differs from state": (lambda: _logits((B + 1, V)), None, "state"),
  "unbatched logits, batched state": (lambda: _logits((V,)), None, "state"),
  "bool mask of width V-1": (_logits, lambda: jnp.ones((B, V - 1), bool), "mask"),
  "bool mask of width V+1": (_logits, lambda: jnp.ones((B, V + 1), bool), "mask"),
  "packed mask of 2 words for V=16": (_logits, lambda: jnp.full((B, 2), -1, jnp.int32), "mask"),
  "packed uint32 mask of 0 words": (_logits, lambda: jnp.zeros((B, 0), jnp.uint32), "mask"),
  "float mask": (_logits, lambda: jnp.ones((B, V), jnp.float32), "mask"),
  "int8 mask": (_logits, lambda: jnp.ones((B, V), jnp.int8), "mask"),
  "mask with more rows": (_logits, lambda: jnp.ones((B + 1, V), bool), "mask"),
  "packed mask with fewer rows": (_logits, lambda: jnp.full((1, 1), -1, jnp.int32), "mask"),
  "unbatched mask for a batch": (_logits, lambda: jnp.ones((V,), bool), "mask"),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("method", ["pick", "pick_with_info", "probs"])
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs(case, method, jit):
  logits, mask, name = BAD_INPUTS[case]
  s = sampler(vocab_size=V)
  state = s.init(seed=[1, 2])
  fn = getattr(s, method)
  if jit:
    fn = jax.jit(fn)
  with pytest.raises(ValueError, match=name):
    fn(logits(), state, None if mask is None else mask())


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_logits_with_rows_need_batched_state(jit):
  s = sampler()
  pick = jax.jit(s.pick) if jit else s.pick
  with pytest.raises(ValueError, match="state"):
    pick(_logits((1, V)), s.init(seed=0))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("rows, token", [((B,), ()), ((B,), (B + 1,)), ((B,), (B, 1)), ((), (1,))])
def test_accept_rejects_token_of_wrong_shape(rows, token, jit):
  s = sampler()
  state = s.init(seed=np.zeros(rows, np.int32))
  accept = jax.jit(s.accept) if jit else s.accept
  with pytest.raises(ValueError, match="token"):
    accept(jnp.zeros(token, jnp.int32), state)


@pytest.mark.parametrize("token", [2.7, -5, V], ids=["float", "below -1", ">= V"])
def test_accept_rejects_bad_token(token):
  s = sampler(vocab_size=V)
  with pytest.raises(ValueError, match="token"):
    s.accept(token, s.init(seed=0))


# -- traced values: NaN and empty rows -----------------------------------------
#
# One sampler and one compiled draw/probs per shape serve every test below
# (compiling the chain takes seconds): ROWS x V rows with a bool mask, and a
# single [V] row with a bool mask. candidates=4 < V, so rows with top_k <= 4
# take the candidate path and the others the full-vocabulary path.

ROWS = 8
RUNTIME = jsample.llama_cpp(window_size=WINDOW, budget=4)
DRAW = jax.jit(RUNTIME.pick_with_info)
PROBS = jax.jit(RUNTIME.probs)
OPEN = dict(top_k=0, top_p=1.0, min_p=0.0)  # every finite token can be drawn


def _all_allowed(shape):
  return jnp.ones(shape, bool)


def _draw_steps(logits, state, steps):
  """Tokens ``[steps, ROWS]`` and validity of ``steps`` successive draws (new keys each step)."""
  tokens, valid = [], []
  for _ in range(steps):
    drawn, state = DRAW(logits, state, _all_allowed(logits.shape))
    tokens.append(np.asarray(drawn.token))
    valid.append(np.asarray(drawn.valid))
    assert np.all(np.isfinite(drawn.logprob))
  return np.stack(tokens), np.stack(valid), state


def test_nan_is_never_drawn():
  x = np.linspace(3.0, 0.0, V).astype(np.float32)
  x[[0, 1, 5]] = np.nan  # the two best positions and one in the middle
  finite = np.flatnonzero(np.isfinite(x))
  logits = jnp.broadcast_to(jnp.asarray(x), (ROWS, V))
  # Rows 0-3 sample all finite tokens (full path), row 4 is greedy, rows 5-7 top-3 (candidate path).
  state = RUNTIME.init(
    seed=np.arange(ROWS),
    temperature=[2.0, 2.0, 2.0, 2.0, 0.0, 1.0, 1.0, 1.0],
    top_k=[0, 0, 0, 0, 0, 3, 3, 3],
    top_p=1.0,
    min_p=0.0,
  )
  steps = 64
  tokens, valid, after = _draw_steps(logits, state, steps)
  assert np.all(valid)
  assert np.all(np.isin(tokens, finite)), sorted(set(tokens.ravel()) - set(finite))
  assert np.all(tokens[:, 4] == 2)  # greedy: the best finite token
  assert set(tokens[:, 5:].ravel()) == {2, 3, 4}  # top-3 of the finite tokens
  assert len(set(tokens[:, :4].ravel())) >= len(finite) - 2  # the draw spreads over the finite ones
  np.testing.assert_array_equal(after.position, steps)
  probs = np.asarray(PROBS(logits, state, _all_allowed(logits.shape)))
  assert np.all(probs[:, [0, 1, 5]] == 0)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_nan_with_default_settings_draws_finite_tokens():
  x = np.array([np.nan, np.nan, 2.0, 1.9, np.nan, 1.8] + [-5.0] * (V - 6), np.float32)
  state = RUNTIME.init(seed=np.arange(ROWS) + 100)  # llama.cpp's defaults; min-p cuts the -5s
  tokens, valid, _ = _draw_steps(jnp.broadcast_to(jnp.asarray(x), (ROWS, V)), state, 32)
  assert np.all(valid)
  assert set(tokens.ravel()) == {2, 3, 5}


def test_empty_rows_are_flagged():
  """Rows 0-3 have no survivor (-inf, NaN, -inf and NaN, all masked); rows 4-7 are fine."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(ROWS, V)).astype(np.float32)
  x[0] = -np.inf
  x[1] = np.nan
  x[2, ::2], x[2, 1::2] = -np.inf, np.nan
  allowed = np.ones((ROWS, V), bool)
  allowed[3] = False
  allowed[5, : V // 2] = False
  state = RUNTIME.init(
    seed=np.arange(ROWS),
    prompt=[[1, 2], [], [3], [4, 4], [0], [9], [7, 7], []],
    temperature=[0.8, 0.0, 1.0, 0.0, 0.7, 0.0, 1.0, 0.5],
    repeat_penalty=[1.5, 1.0, 2.0, 0.5, 1.0, 1.3, 0.8, 1.0],  # 0.5 and 0.8 take the full path
    top_k=[40, 0, 3, 0, 40, 1, 0, 2],
  )
  drawn, after = DRAW(jnp.asarray(x), state, jnp.asarray(allowed))
  probs = np.asarray(PROBS(jnp.asarray(x), state, jnp.asarray(allowed)))
  np.testing.assert_array_equal(drawn.valid, [False] * 4 + [True] * 4)
  np.testing.assert_array_equal(drawn.token[:4], 0)
  assert np.all((np.asarray(drawn.token) >= 0) & (np.asarray(drawn.token) < V))
  assert np.all(np.isfinite(drawn.logprob))
  np.testing.assert_array_equal(drawn.logprob[:4], 0.0)
  np.testing.assert_array_equal(probs[:4], 0.0)
  np.testing.assert_allclose(probs[4:].sum(-1), 1.0, atol=1e-5)
  assert int(drawn.token[5]) >= V // 2  # the mask holds on the valid rows
  np.testing.assert_array_equal(after.position, np.asarray(state.position) + 1)


@pytest.mark.parametrize("kind", ["-inf", "nan", "-inf and nan", "masked"])
@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.0, repeat_penalty=0.5), OPEN], ids=str)
def test_empty_single_row(kind, settings):
  x = np.full(V, 1.0, np.float32)
  allowed = np.ones(V, bool)
  if kind == "masked":
    allowed[:] = False
  else:
    x[:] = -np.inf if kind == "-inf" else np.nan
    if kind == "-inf and nan":
      x[::3] = np.nan
  state = RUNTIME.init(seed=3, prompt=[1, 2, 3], **settings)
  drawn, after = DRAW(jnp.asarray(x), state, jnp.asarray(allowed))
  assert drawn.token.shape == () and int(drawn.token) == 0
  assert not bool(drawn.valid)
  assert float(drawn.logprob) == 0.0
  np.testing.assert_array_equal(PROBS(jnp.asarray(x), state, jnp.asarray(allowed)), np.zeros(V, np.float32))
  assert int(after.position) == 4


@pytest.mark.parametrize(
  "settings",
  [
    # Rows with top_k=0 and top_p near 1 need more than 4 candidates: the full path runs.
    dict(top_k=[0, 3, 0, 0, 4, 0, 1, 0], top_p=[0.999, 0.9, 1.0, 1.0, 1.0, 0.95, 1.0, 1.0], min_p=0.0),
    # Every row fits in 4 candidates: only the candidate path runs.
    dict(top_k=[4, 3, 0, 2, 4, 1, 3, 4], top_p=[0.999, 0.9, 1.0, 1.0, 1.0, 0.95, 1.0, 1.0], min_p=0.0),
  ],
  ids=["full path", "candidate path"],
)
@pytest.mark.parametrize("empty", ["-inf", "nan", "masked"])
def test_empty_row_does_not_disturb_others(settings, empty):
  """Row 2 is empty; the other rows draw what they draw alone."""
  rng = np.random.default_rng(1)
  x = rng.normal(0, 2, (ROWS, V)).astype(np.float32)
  allowed = np.ones((ROWS, V), bool)
  if empty == "masked":
    allowed[2] = False
  else:
    x[2] = -np.inf if empty == "-inf" else np.nan
  settings = dict(settings, temperature=[1.0, 0.7, 1.0, 0.0, 1.5, 1.0, 1.0, 0.3], repeat_penalty=1.3)
  seeds = np.arange(ROWS) + 11
  prompts = [[1, 2, 3], [4], [5], [], [6, 6], [0], [15, 14], [8]]
  state = RUNTIME.init(seed=seeds, prompt=prompts, **settings)
  together, _ = DRAW(jnp.asarray(x), state, jnp.asarray(allowed))
  assert not bool(together.valid[2])
  for i in set(range(ROWS)) - {2}:
    row_settings = {k: v[i] if isinstance(v, list) else v for k, v in settings.items()}
    alone_state = RUNTIME.init(seed=seeds[i], prompt=prompts[i], **row_settings)
    alone, _ = DRAW(jnp.asarray(x[i]), alone_state, jnp.asarray(allowed[i]))
    assert bool(alone.valid)
    assert int(together.token[i]) == int(alone.token), f"row {i}"
    np.testing.assert_allclose(together.logprob[i], alone.logprob, rtol=1e-6)


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(), OPEN], ids=str)
def test_positive_infinity_is_the_certain_token(settings):
  x = np.zeros(V, np.float32)
  x[7] = np.inf
  state = RUNTIME.init(seed=5, **settings)
  drawn, _ = DRAW(jnp.asarray(x), state, _all_allowed(V))
  assert bool(drawn.valid)
  assert int(drawn.token) == 7
  # A masked +inf is just masked: the rest of the row samples as usual.
  allowed = np.ones(V, bool)
  allowed[7] = False
  probs = np.asarray(PROBS(jnp.asarray(x), state, jnp.asarray(allowed)))
  assert probs[7] == 0 and probs.sum() == pytest.approx(1.0)


def test_chain_rejects_penalties_after_other_stages():
  with pytest.raises(ValueError, match="stages"):
    jsample.chain(jsample.temperature(0.25), jsample.penalties(frequency=1.0))


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, [0, -3]], ids=str)
def test_init_rejects_bad_seed(seed):
  with pytest.raises(ValueError, match="seed"):
    sampler().init(seed=seed)


def test_init_rejects_boolean_settings():
  with pytest.raises(ValueError, match="top_k"):
    sampler().init(top_k=True)


@pytest.mark.parametrize("recipe", [jsample.llama_cpp, jsample.gemma, jsample.hf])
def test_recipes_reject_unknown_keywords(recipe):
  with pytest.raises(ValueError, match="top_q"):
    recipe(top_q=0.9)


# -- argument order: arrays first, the state last ---------------------------------------


@pytest.mark.parametrize(
  "call",
  [
    lambda s, state, x: s.pick(state, x),
    lambda s, state, x: s.pick_with_info(state, x),
    lambda s, state, x: s.probs(state, x),
    lambda s, state, x: s.explain(state, x),
    lambda s, state, x: s.accept(state, 1),
    lambda s, state, x: s.load_prompt(state, [1, 2]),
    lambda s, state, x: s.verify(jnp.zeros(2, jnp.int32), jnp.zeros((2, V)), state, jnp.zeros((3, V))),
    lambda s, state, x: s.configure(x, temperature=0.5),
    lambda s, state, x: s.fork(x, n=2),
  ],
  ids=["pick", "pick_with_info", "probs", "explain", "accept", "load_prompt", "verify", "configure", "fork"],
)
def test_swapped_arguments_say_the_state_comes_last(call):
  s = sampler()
  with pytest.raises(TypeError, match="the state comes last"):
    call(s, s.init(seed=0), jnp.zeros(V))
