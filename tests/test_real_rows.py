"""Real next-token rows of Gemma 3 270M (recorded with llama.cpp) through the chain."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from tests.helpers import (
  NEUTRAL_PENALTIES,
  OPTIMISED,
  WINDOW,
  check_against_reference,
  full_path_probs,
  full_path_tokens,
  hf_stages,
  llama_stages,
)

SETTINGS = [
  dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's defaults
  dict(temperature=1.0, top_k=64, top_p=0.95, min_p=0.05),  # Gemma's
  dict(temperature=1.0, top_k=0, top_p=0.95, min_p=0.05),
  dict(temperature=1.6, top_k=0, top_p=0.9, min_p=0.0),
  dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
  dict(temperature=0.7, top_k=0, top_p=0.95, min_p=0.0, repeat_penalty=1.1),
]


@pytest.fixture(scope="module")
def logits(reference_file):
  with np.load(reference_file("gemma3-270m-rows.npz")) as data:
    return data["logits"]


@pytest.mark.parametrize("recipe, stages_of", [(jsample.llama_cpp, llama_stages), (jsample.hf, hf_stages)])
@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_real_rows_match_the_reference(logits, recipe, stages_of, settings):
  check_real_rows(logits, recipe, "auto", stages_of, settings)


# The accelerator strategy on a CPU runs every row's searches over all of V: two cases, one decided on
# candidates (llama.cpp's defaults) and one on the full path (temperature first, top-k off).
@pytest.mark.exhaustive
@pytest.mark.parametrize(
  "recipe, stages_of, settings",
  [(jsample.llama_cpp, llama_stages, SETTINGS[0]), (jsample.hf, hf_stages, SETTINGS[3])],
  ids=["llama_cpp-defaults", "hf-temperature-first"],
)
def test_real_rows_match_the_reference_on_the_accelerator_strategy(logits, recipe, stages_of, settings):
  check_real_rows(logits, recipe, "accelerator", stages_of, settings)


@functools.cache
def _compiled(recipe, strategy: str):
  """The recipe's sampler and its four compiled functions. The settings are state values, so every case of one
  recipe and strategy shares them: each compile at Gemma's vocabulary takes several seconds."""
  sampler = recipe(window_size=WINDOW, strategy=strategy)
  jit = functools.partial(jax.jit, compiler_options=OPTIMISED)
  return (
    sampler,
    jit(sampler.probs),
    jit(lambda x, s: full_path_probs(sampler, x, s)),
    jit(sampler.pick),
    jit(lambda x, s: full_path_tokens(sampler, x, s)),
  )


def check_real_rows(logits, recipe, strategy, stages_of, settings):
  """Probabilities of both paths against the reference, and the tokens of both paths alike."""
  sampler, probs_of, full_probs_of, pick, full_tokens_of = _compiled(recipe, strategy)
  size = logits.shape[0]
  prompts = [[int(t) for t in np.argsort(-row.astype(np.float32))[i % 3 : i % 3 + 6]] for i, row in enumerate(logits)]
  state = sampler.init(seed=np.arange(size), prompt=prompts, **settings)
  x = jnp.asarray(logits)  # float16, as recorded
  rows = logits.astype(np.float32)
  probs, full = probs_of(x, state), full_probs_of(x.astype(jnp.float32), state)
  check_against_reference([probs, full], rows, [{**NEUTRAL_PENALTIES, **settings}] * size, prompts, stages_of)
  tokens, _ = pick(x, state)
  np.testing.assert_array_equal(tokens, full_tokens_of(x.astype(jnp.float32), state))


def test_llama_cpp_defaults_without_top_k_stay_on_the_candidate_path(logits):
  # Real nuclei are small: top-p 0.95 and min-p 0.05 settle within K = 64.
  sampler = jsample.llama_cpp(budget=64)
  state = sampler.init(seed=np.arange(logits.shape[0]), top_k=0)
  assert bool(jnp.all(jsample.testing.settled_on_candidates(sampler, jnp.asarray(logits), state)))
