"""Checked mode: the traced problems jit lets through become errors (checkify)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jsample

V = 40
WINDOW = 8
PLAIN = jsample.llama_cpp(window_size=WINDOW, budget=8)
CHECKED = PLAIN.checked()
# Compiled once for the file: every problem below is a new value at the same shapes, so none compiles again.
DRAW = jax.jit(checkify.checkify(CHECKED.pick_with_info))
PLAIN_DRAW = jax.jit(PLAIN.pick_with_info)
ROWS = 4


def fine():
  rng = np.random.default_rng(0)
  x = rng.normal(0, 2, (ROWS, V)).astype(np.float32)
  state = CHECKED.init(seed=np.arange(ROWS), prompt=[[1, 2], [3], [], [39, 0]], top_k=[0, 4, 40, 1])
  return x, state, np.ones((ROWS, V), bool)


def set_row(state, name, row, value):
  values = state.settings[name].at[row].set(value)  # the same dtype and placement: DRAW's program serves it
  return state._replace(settings={**state.settings, name: values})


def test_good_inputs_pass_and_draw_what_the_plain_sampler_draws():
  x, state, allowed = fine()
  err, (drawn, after) = DRAW(x, state, allowed)
  assert err.get() is None
  plain, _ = PLAIN_DRAW(x, state, allowed)
  np.testing.assert_array_equal(drawn.token, plain.token)


PROBLEMS = {
  "top_p 0": (lambda x, s, m: (x, set_row(s, "top_p", 2, 0.0), m), "top_p: must be in (0, 1]; row 2 holds 0.0"),
  "repeat 0": (lambda x, s, m: (x, set_row(s, "repeat_penalty", 1, 0.0), m), "repeat_penalty: must be finite and > 0"),
  "temperature NaN": (lambda x, s, m: (x, set_row(s, "temperature", 3, np.nan), m), "temperature: must be finite"),
  "min_p 2": (lambda x, s, m: (x, set_row(s, "min_p", 0, 2.0), m), "min_p: must be in [0, 1]; row 0 holds 2.0"),
  "last_n past the window": (
    lambda x, s, m: (x, set_row(s, "penalty_last_n", 1, WINDOW + 1), m),
    f"penalty_last_n: must be <= window_size={WINDOW}",
  ),
  "window id >= V": (lambda x, s, m: (x, s._replace(window=s.window.at[2, 5].set(V)), m), "state.window"),
  "window id < -1": (lambda x, s, m: (x, s._replace(window=s.window.at[0, 0].set(-3)), m), "state.window"),
  "NaN logit": (lambda x, s, m: (_nan(x), s, m), "row 1 holds NaN"),
  "empty row": (lambda x, s, m: (x, s, _masked(m)), "row 3 has no token"),
}


def _nan(x):
  x = x.copy()
  x[1, 7] = np.nan
  return x


def _masked(m):
  m = m.copy()
  m[3] = False
  return m


@pytest.mark.parametrize("problem", PROBLEMS)
def test_each_problem_is_an_error_under_jit(problem):
  make, message = PROBLEMS[problem]
  x, state, allowed = make(*fine())
  err, _ = DRAW(x, state, allowed)
  with pytest.raises(checkify.JaxRuntimeError, match=message.replace("(", r"\(").replace("[", r"\[")):
    err.throw()
  if problem in ("NaN logit", "empty row"):  # defined results without checked mode
    drawn, _ = PLAIN_DRAW(x, state, allowed)
    assert np.all((np.asarray(drawn.token) >= 0) & (np.asarray(drawn.token) < V))


def test_outside_jit_the_error_is_raised_at_once():
  x, state, allowed = fine()
  with pytest.raises(checkify.JaxRuntimeError, match="top_p"):
    CHECKED.pick(x, set_row(state, "top_p", 0, -1.0), allowed)


def test_nan_and_empty_rows_can_be_left_to_the_defined_result():
  lenient = PLAIN.checked(nan=False, empty=False)
  x, state, allowed = fine()
  x[1] = np.nan
  draw = jax.jit(checkify.checkify(lenient.pick_with_info))  # one program for both calls
  err, (drawn, _) = draw(x, state, allowed)
  assert err.get() is None
  assert not bool(drawn.valid[1])
  err, _ = draw(x, set_row(state, "top_p", 0, 0.0), allowed)
  assert "top_p" in err.get()


def test_token_ids_given_to_seed_and_accept():
  sampler = jsample.llama_cpp(window_size=WINDOW, vocab_size=V).checked()
  state = sampler.init(seed=[0, 1])
  seed = jax.jit(checkify.checkify(sampler.load_prompt))
  assert seed(jnp.array([[3, -1], [4, 5]]), state)[0].get() is None
  assert "prompt: token ids must be in [-1, 40)" in seed(jnp.array([[3, -1], [4, 40]]), state)[0].get()
  assert "prompt" in seed(jnp.array([[3, -5], [4, 5]]), state)[0].get()
  accept = jax.jit(checkify.checkify(sampler.accept))
  assert accept(jnp.array([0, 39]), state)[0].get() is None
  assert "token: token ids must be in [0, 40); entry 0 (flat) holds -1" in accept(jnp.array([-1, 39]), state)[0].get()


def test_a_checked_generation_loop_stops_at_the_first_bad_step():
  """A traced setting that goes bad inside lax.scan surfaces after the loop."""
  x, state, allowed = fine()

  def generate(x, state):
    def step(state, i):
      # a traced update that goes bad at step 5
      state = CHECKED.configure(state, temperature=jnp.where(i == 5, jnp.nan, 0.7))
      token, state = CHECKED.pick(x, state)
      return state, token

    return jax.lax.scan(step, state, jnp.arange(10))

  err, (_, tokens) = jax.jit(checkify.checkify(generate))(x, state)
  assert tokens.shape == (10, ROWS)
  with pytest.raises(checkify.JaxRuntimeError, match="temperature: must be finite"):
    err.throw()


def test_without_checkify_jit_says_what_is_missing():
  x, state, allowed = fine()
  with pytest.raises(Exception, match="checkify"):
    jax.jit(CHECKED.pick)(x, state, allowed)


def test_a_setting_check_written_with_numpy_is_named():
  stage = jsample.Stage(
    "numpy",
    (jsample.Setting("numpy_setting", 1.0, jnp.float32, np.isfinite, "finite"),),
    lambda c, s, ctx: c,
    lambda x, s, ctx: x,
  )
  sampler = jsample.chain(stage).checked()
  with pytest.raises(ValueError, match="numpy_setting"):
    jax.jit(checkify.checkify(sampler.pick))(jnp.zeros(4), sampler.init(seed=0))
