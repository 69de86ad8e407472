"""A user writes a new stage without touching the library: epsilon sampling."""

import jax
import jax.numpy as jnp
import numpy as np

import jsample
from tests.helpers import row


def epsilon(eps: float = 3e-4) -> jsample.Stage:
  """Keeps tokens whose probability is at least ``eps`` (Hewitt et al., 2022)."""
  setting = jsample.Setting("epsilon", eps, jnp.float32, lambda v: (v >= 0) & (v < 1), "in [0, 1)")

  def on_candidates(c: jsample.Candidates, s: dict, ctx: jsample.Context) -> jsample.Candidates:
    log_eps = jnp.log(s["epsilon"])
    log_total = c.log_total()  # NaN when unknown: then nothing below compares True
    keep = (c.logits - log_total >= log_eps) | (jnp.arange(c.ids.shape[0]) == 0)
    last_out = c.logits[-1] - log_total < log_eps  # so is everything outside
    done = c.complete | last_out
    return c.keep(keep)._replace(complete=done, exact=c.exact & (done | (s["epsilon"] <= 0)))

  def on_row(logits: jax.Array, s: dict, ctx: jsample.Context) -> jax.Array:
    log_total = jax.nn.logsumexp(logits)
    keep = (logits - log_total >= jnp.log(s["epsilon"])) | (logits == jnp.max(logits))
    return jnp.where(keep, logits, -jnp.inf)

  return jsample.Stage("epsilon", (setting,), on_candidates, on_row)


def reference(x: np.ndarray, eps: float, t: float) -> np.ndarray:
  p = np.exp(x.astype(np.float64) - x.max())
  p /= p.sum()
  keep = (p >= eps) | (x == x.max())
  q = np.where(keep, np.exp((x.astype(np.float64) - x.max()) / t), 0)
  return q / q.sum()


def test_a_stage_written_outside_the_library_joins_a_chain():
  rng = np.random.default_rng(0)
  xs = np.stack([row(rng, 2000, kind) for kind in ("normal", "peaked") * 8])
  eps = rng.choice([1e-4, 1e-3, 3e-2], len(xs))
  for budget in (16, 1024):  # mostly the full-vocabulary path, then mostly candidates
    sampler = jsample.chain(epsilon(), jsample.temperature(0.7), budget=budget)
    state = sampler.init(seed=np.arange(len(xs)), epsilon=eps)
    probs = np.asarray(jax.jit(sampler.probs)(jnp.asarray(xs), state), np.float64)
    for i, x in enumerate(xs):
      np.testing.assert_allclose(probs[i], reference(x, eps[i], 0.7), atol=1e-6)
