"""A user writes a new stage without touching the library: epsilon sampling.

It is written to the public contract only (``jsample.Stage``, ``Setting``,
``Candidates``, ``Context``) and checked by the public conformance suite.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jsample
import jsample.testing


def epsilon(eps: float = 3e-4) -> jsample.Stage:
  """Keeps tokens whose probability is at least ``eps``, and the best one (Hewitt et al., 2022)."""
  setting = jsample.Setting(
    "epsilon", eps, jnp.float32, lambda v: (v >= 0) & (v < 1), "in [0, 1)", 0.0, "drop tokens less likely than this"
  )

  def on_candidates(c: jsample.Candidates, s: jsample.Settings, ctx: jsample.Context) -> jsample.Candidates:
    log_z, known = c.log_normaliser()  # over every survivor, candidates or not
    log_eps = jnp.log(s["epsilon"])
    best = c.logits == jnp.max(c.logits)  # the best token survives, with its exact ties
    keep = (c.logits - log_z >= log_eps) | best
    # Tokens beyond the candidates rank below the last one: if it falls, so do they.
    last_out = (c.logits[-1] - log_z < log_eps) & ~best[-1]
    done = c.covers_row | (known & last_out)
    off = s["epsilon"] <= 0
    return c.keep(keep | off)._replace(
      covers_row=jnp.where(off, c.covers_row, done),
      log_z_known=c.log_z_known & off,  # removing tokens changes the row's normaliser
      decided=c.decided & (off | (known & done)),
    )

  def on_row(logits: jax.Array, s: jsample.Settings, ctx: jsample.Context) -> jax.Array:
    log_z = jax.nn.logsumexp(logits)
    keep = (logits - log_z >= jnp.log(s["epsilon"])) | (logits == jnp.max(logits))
    return jnp.where(keep | (s["epsilon"] <= 0), logits, -jnp.inf)

  return jsample.Stage("epsilon", (setting,), on_candidates, on_row)


def reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  """Epsilon's action on one row, in float64."""
  alive = x > -np.inf
  if not alive.any() or s["epsilon"] <= 0:
    return x
  p = np.where(alive, np.exp(x - x[alive].max()), 0)
  p /= p.sum()
  return np.where((p >= s["epsilon"]) | (x == x[alive].max()), x, -np.inf)


def test_a_stage_written_outside_the_library_conforms():
  settings = [dict(epsilon=1.07e-3), dict(epsilon=0.0), dict(epsilon=3.1e-2), dict(epsilon=1.3e-4)]
  jsample.testing.assert_stage_conforms(epsilon(), reference, settings)


def test_it_joins_a_recipe_order():
  sampler = jsample.chain(jsample.penalties(repeat=1.1), epsilon(), jsample.top_k(40), jsample.temperature(0.7))
  state = sampler.init(seed=[1, 2], prompt=[[3, 4], [5]], epsilon=[1e-3, 0.0])
  tokens, state = jax.jit(sampler.pick)(jnp.zeros((2, 100)).at[:, 3].set(2.0), state)
  assert tokens.shape == (2,) and int(state.position[0]) == 3
