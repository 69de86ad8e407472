"""The two-stage cut equals lax.top_k of the cleaned rows, ties and hostile values included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsample._src.kernels import cut
from jsample._src.kernels.masks import pack
from tests.helpers import CUT_KINDS, cut_rows


@pytest.mark.parametrize("vocab", [1000, 4099, 100003])
@pytest.mark.parametrize("kind", CUT_KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_two_stage_cut_equals_top_k(vocab, kind, dtype):
  rng = np.random.default_rng(vocab)
  x = jnp.asarray(cut_rows(rng, kind, vocab), dtype)
  allowed = rng.random((3, vocab)) < 0.5
  for mask in (None, jnp.asarray(allowed), pack(allowed)):
    expected = jax.lax.top_k(jax.vmap(cut.clean_row)(x, mask), 40)
    got = jax.jit(cut.top_candidates, static_argnums=2)(x, mask, 40)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
