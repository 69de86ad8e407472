"""The two-stage cut equals lax.top_k of the cleaned rows, ties and hostile values included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsample._src import cut
from jsample._src.masks import pack


def rows(rng, kind, vocab):
  if kind == "normal":
    return rng.normal(size=(3, vocab))
  if kind == "ties":
    return rng.integers(-3, 3, (3, vocab)).astype(float)
  if kind == "sparse":
    x = np.full((3, vocab), -np.inf)
    x[:, rng.integers(0, vocab, 5)] = 1.0
    return x
  if kind == "nan":
    x = rng.normal(size=(3, vocab))
    x[rng.random((3, vocab)) < 0.1] = np.nan
    x[0, 5] = np.inf
    return x
  if kind == "infinities":
    x = rng.normal(size=(3, vocab))
    x[1, 7], x[1, 9], x[2, 3] = np.inf, -np.inf, -np.nan
    return x
  x = np.zeros((3, vocab))  # signed zeros
  x[1, ::3] = -0.0
  return x


@pytest.mark.parametrize("vocab", [1000, 4099, 100003])
@pytest.mark.parametrize("kind", ["normal", "ties", "sparse", "nan", "infinities", "zeros"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_two_stage_cut_equals_top_k(vocab, kind, dtype):
  rng = np.random.default_rng(vocab)
  x = jnp.asarray(rows(rng, kind, vocab), dtype)
  allowed = rng.random((3, vocab)) < 0.5
  for mask in (None, jnp.asarray(allowed), pack(allowed)):
    expected = jax.lax.top_k(jax.vmap(cut.full_row)(x, mask), 40)
    got = jax.jit(cut.top_candidates, static_argnums=2)(x, mask, 40)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
