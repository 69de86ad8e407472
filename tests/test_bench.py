"""The benchmark's baselines draw from the same distribution as jsample's reference.

Each baseline is another engine's algorithm, written for the benchmark; these
tests make sure the benchmark times honest implementations of the same chain
(temperature first, then top-k, then top-p), not cheaper approximations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bench import baselines
from tests.reference import probabilities

SETTINGS = [(1.0, 0, 1.0), (0.7, 50, 1.0), (1.6, 0, 0.9), (1.0, 64, 0.95), (0.5, 3, 0.5), (2.0, 1000, 0.3)]


def hf_stages(t, k, p):
  return [("temperature", t), ("top_k", k), ("top_p", p)]


@pytest.mark.parametrize("base", baselines.BASELINES, ids=lambda b: b.name)
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_baseline_probabilities_match_the_reference(base, setting):
  t, k, p = setting
  if base.name == "lax.top_k" and k <= 0:
    pytest.skip("lax.top_k needs top-k on")
  rng = np.random.default_rng(0)
  # Continuous rows (no exact ties): the bit search keeps every tie at its boundary.
  xs = np.stack([rng.normal(0, scale, 1000) for scale in (0.3, 1.0, 3.0, 8.0)]).astype(np.float32)
  got = np.asarray(jax.jit(base.probs, static_argnums=(1, 2, 3))(jnp.asarray(xs), t, k, p), np.float64)
  for x, row in zip(xs, got, strict=True):
    want = probabilities(x, hf_stages(t, k, p))
    np.testing.assert_array_equal(row > 0, want > 0)
    np.testing.assert_allclose(row, want, atol=1e-6)


@pytest.mark.parametrize("base", baselines.BASELINES, ids=lambda b: b.name)
def test_baseline_draws_follow_the_reference(base):
  t, k, p = 0.8, 5, 0.9
  x = np.log(np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.05, 0.02], np.float32))
  n = 40_000
  tokens = jax.jit(base.sample, static_argnums=(2, 3, 4))(jax.random.key(1), jnp.tile(jnp.asarray(x), (n, 1)), t, k, p)
  want = probabilities(x, hf_stages(t, k, p))
  alive = want > 0
  counts = np.bincount(np.asarray(tokens), minlength=x.size)
  assert counts[~alive].sum() == 0
  assert stats.chisquare(counts[alive], want[alive] * n).pvalue > 1e-4
