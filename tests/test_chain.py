"""The chain against the float64 NumPy reference, on both paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from tests.helpers import WINDOW, batch, check_against_reference, full_path_probs, hf_stages, llama_stages

pytestmark = pytest.mark.usefixtures("every_strategy")  # conftest.py: each test under both strategies


LLAMA, HF = (jsample.llama_cpp, llama_stages), (jsample.hf, hf_stages)
# Each case compiles its recipe twice (the probabilities, and the full path alone) at its own shapes. The default
# run takes each width once, the two orders in turn: below the budget (8, 33: the candidates are the whole row)
# and above it (1000, not a multiple of 32; 4096), each order on both sides. The other pairs are in the exhaustive
# tier: the widths exercise the same machinery under either order.
CASES = [
  (LLAMA, 8, 600),
  (HF, 33, 600),
  (LLAMA, 1000, 480),
  (HF, 4096, 240),
  *(
    pytest.param(r, v, n, marks=pytest.mark.exhaustive)
    for r, v, n in [(HF, 8, 600), (LLAMA, 33, 600), (HF, 1000, 480), (LLAMA, 4096, 240)]
  ),
  *(pytest.param(r, 100, 600, marks=pytest.mark.exhaustive) for r in (LLAMA, HF)),
]


@pytest.mark.parametrize(
  "recipe, vocab, size", CASES, ids=lambda v: getattr(v[0], "__name__", None) if isinstance(v, tuple) else None
)
def test_matches_reference(recipe, vocab, size):
  recipe, stages_of = recipe
  xs, all_settings, per_row, prompts = batch(vocab, vocab, size)
  sampler = recipe(window_size=WINDOW, budget=64)
  state = sampler.init(seed=np.arange(size), prompt=prompts, **per_row)
  fast_or_full = jax.jit(sampler.probs)(jnp.asarray(xs), state)
  full = jax.jit(lambda x, s: full_path_probs(sampler, x, s))(jnp.asarray(xs), state)
  check_against_reference([fast_or_full, full], xs, all_settings, prompts, stages_of)


def test_matches_reference_at_gemma_vocabulary():
  vocab, size = 262144, 12
  xs, all_settings, per_row, prompts = batch(1, vocab, size)
  sampler = jsample.llama_cpp(window_size=WINDOW)
  state = sampler.init(seed=np.arange(size), prompt=prompts, **per_row)
  check_against_reference([jax.jit(sampler.probs)(jnp.asarray(xs), state)], xs, all_settings, prompts, llama_stages)


def test_masks_apply_before_everything():
  vocab, size = 300, 120
  xs, all_settings, per_row, prompts = batch(7, vocab, size)
  allowed = np.random.default_rng(0).random((size, vocab)) < 0.2
  sampler = jsample.llama_cpp(window_size=WINDOW, budget=32)
  state = sampler.init(seed=0, prompt=prompts, **per_row)
  probs = np.asarray(jax.jit(sampler.probs)(jnp.asarray(xs), state, allowed), np.float64)
  masked = np.where(allowed, xs, -np.inf)
  check_against_reference([probs], masked, all_settings, prompts, llama_stages)
  packed = jsample.pack_mask(allowed)
  np.testing.assert_array_equal(probs, jax.jit(sampler.probs)(jnp.asarray(xs), state, packed))
