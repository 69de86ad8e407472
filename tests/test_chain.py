"""The chain against the float64 NumPy reference, on both paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from tests import reference, rows

WINDOW = 16
NUDGE = 2e-6  # relative; wider than the float32 rounding of a mass or a threshold


def llama_stages(s: dict) -> list:
  penalties = dict(
    repeat=s["repeat_penalty"],
    frequency=s["frequency_penalty"],
    presence=s["presence_penalty"],
    last_n=s["penalty_last_n"],
  )
  return [
    ("penalties", penalties),
    ("top_k", s["top_k"]),
    ("top_p", s["top_p"]),
    ("min_p", s["min_p"]),
    ("temperature", s["temperature"]),
  ]


def hf_stages(s: dict) -> list:
  llama = dict(llama_stages(s))
  order = ["penalties", "temperature", "top_k", "top_p", "min_p"]
  return [(name, llama[name]) for name in order]


def batch(seed: int, vocab: int, size: int, kinds=rows.KINDS):
  """``size`` random rows with random settings and prompts."""
  rng = np.random.default_rng(seed)
  xs, all_settings, prompts = [], [], []
  for i in range(size):
    x = rows.row(rng, vocab, kinds[i % len(kinds)])
    xs.append(x)
    all_settings.append(rows.settings(rng, vocab, WINDOW))
    prompts.append(rows.prompt(rng, x, WINDOW))
  per_row = {name: np.array([s[name] for s in all_settings]) for name in all_settings[0]}
  return np.stack(xs), all_settings, per_row, prompts


def full_path_probs(sampler, x, state):
  """Probabilities from the full-vocabulary path alone, for every row."""
  return jsample.testing.full_path_probs(sampler, x, state)


def check_against_reference(outputs, xs, all_settings, prompts, stages_of):
  """Each of ``outputs`` (probabilities ``[B, V]``) has the reference's survivors,
  and its probabilities within 1e-6.

  Where a top-p or min-p boundary lies within float32 rounding (the reference
  nudged by ``NUDGE`` either way disagrees), the survivors must lie between the
  two nudged sets, and the probabilities must be the reference's over them.
  """
  outputs = [np.asarray(probs, np.float64) for probs in outputs]
  for i, (x, s, p) in enumerate(zip(xs, all_settings, prompts, strict=True)):
    kwargs = dict(window=p[-WINDOW:])
    mid = reference.probabilities(x, stages_of(s), **kwargs)
    narrow, _ = reference.survivors_and_logits(x, stages_of(s), nudge=-NUDGE, **kwargs)
    wide, final = reference.survivors_and_logits(x, stages_of(s), nudge=NUDGE, **kwargs)
    for probs in outputs:
      got = probs[i] > 0
      expected = mid
      if np.array_equal(narrow, wide):
        np.testing.assert_array_equal(got, mid > 0, err_msg=f"row {i}: survivors, settings {s}")
      else:
        assert np.all(got <= wide) and np.all(narrow <= got), f"row {i}: survivors outside rounding, settings {s}"
        expected = np.where(got, np.exp(final - final[got].max()), 0.0)
        expected /= expected.sum()
      np.testing.assert_allclose(probs[i], expected, atol=1e-6, err_msg=f"row {i}: probabilities, settings {s}")


@pytest.mark.parametrize("recipe, stages_of", [(jsample.llama_cpp, llama_stages), (jsample.hf, hf_stages)])
@pytest.mark.parametrize("vocab, size", [(8, 600), (33, 600), (100, 600), (1000, 480), (4096, 240)])
def test_matches_reference(recipe, stages_of, vocab, size):
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
