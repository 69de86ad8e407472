"""Golden tokens: the exact tokens, ``valid`` flags and log-probabilities of a
fixed set of rows, seeds, positions, recipes, masks and dtypes.

Refactors must keep these bit for bit. A change that alters tokens on purpose
(a new noise construction, say) regenerates the file and says why in its commit:
``python3 -m tests.test_golden`` rewrites ``tests/golden.npz``.
"""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jsample
from tests.helpers import KINDS, row, settings

GOLDEN = pathlib.Path(__file__).with_name("golden.npz")
VOCAB = 1000  # not a multiple of 32: the padded chunks and mask words are exercised
BATCH = 16
STEPS = 3
WINDOW = 16

RECIPES = {
  "llama_cpp": lambda: jsample.llama_cpp(window_size=WINDOW),
  "gemma_repeat": lambda: jsample.gemma(repeat_penalty=1.1, window_size=WINDOW),
  "hf_hot": lambda: jsample.hf(temperature=1.6, top_p=0.9, top_k=0, window_size=WINDOW),
  "wide_nucleus": lambda: jsample.llama_cpp(top_k=0, top_p=0.95, min_p=0.05, window_size=WINDOW, budget=16),
  "raising_penalties": lambda: jsample.llama_cpp(
    frequency_penalty=-0.3, presence_penalty=-0.2, repeat_penalty=0.9, window_size=WINDOW, budget=16
  ),
  "pure": lambda: jsample.chain(jsample.temperature(1.0), budget=16),
  "greedy": lambda: jsample.gemma(temperature=0.0, window_size=WINDOW),
}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _mixed_settings(rng: np.random.Generator) -> dict:
  """Per-row settings for the llama.cpp chain, every stage on in some rows."""
  per_row = [settings(rng, VOCAB, WINDOW) for _ in range(BATCH)]
  return {name: np.array([s[name] for s in per_row]) for name in per_row[0]}


def cases():
  """``(name, sampler, settings, logits [BATCH, VOCAB], mask or None, prompt)`` for every case."""
  rng = np.random.default_rng(20261130)
  base = np.stack([row(rng, VOCAB, kind) for kind in KINDS * 3][:BATCH])
  allowed = rng.random((BATCH, VOCAB)) < 0.3
  allowed[:, 0] = True
  prompt = [[int(t) for t in rng.integers(0, VOCAB, int(n))] for n in rng.integers(0, 2 * WINDOW, BATCH)]
  recipes = dict(RECIPES, mixed=lambda: jsample.llama_cpp(window_size=WINDOW, budget=16))
  for recipe, build in recipes.items():
    settings = _mixed_settings(rng) if recipe == "mixed" else {}
    for dtype in DTYPES:
      for mask in ("none", "bool", "packed") if dtype == "float32" else ("none",):
        form = None if mask == "none" else allowed if mask == "bool" else np.asarray(jsample.pack_mask(allowed))
        yield f"{recipe}/{dtype}/{mask}", build(), settings, base.astype(DTYPES[dtype]), form, prompt


# One compiled step per chain (its stages, sizes and strategy), shared by the cases that run the same chain with
# other setting defaults (wide_nucleus, raising_penalties and mixed; gemma_repeat and greedy): a recipe's defaults
# only fill the state (Sampler.init), so the program is the same and compiling it again checks nothing more.
_STEPS: dict = {}


def _step(sampler):
  key = (tuple(stage.name for stage in sampler.stages), sampler.window_size, sampler.budget, sampler.strategy)
  if key not in _STEPS:
    _STEPS[key] = jax.jit(sampler.pick_with_info)
  return _STEPS[key]


_step.cache_clear = _STEPS.clear  # conftest.py's release_compiled_programs empties it after the file


def run_case(sampler, settings, logits, mask, prompt):
  """``(tokens, valid, logprob)``, each ``[STEPS, BATCH]``."""
  state = sampler.init(seed=np.arange(BATCH) * 7 + 3, prompt=prompt, **settings)
  step = _step(sampler)
  out = []
  for i in range(STEPS):
    shifted = jnp.asarray(logits) + jnp.asarray(0.25 * i, logits.dtype)
    drawn, state = step(shifted, state, mask=mask)
    out.append(jax.tree.map(np.asarray, drawn))
  return tuple(np.stack([getattr(d, f) for d in out]) for f in ("token", "valid", "logprob"))


def record() -> None:
  arrays = {}
  for name, *case in cases():
    for field, value in zip(("token", "valid", "logprob"), run_case(*case), strict=True):
      arrays[f"{name}/{field}"] = value
  np.savez_compressed(GOLDEN, **arrays)


@pytest.mark.parametrize(
  "strategy, part",
  [("cpu", "core"), pytest.param("cpu", "rest", marks=pytest.mark.exhaustive), ("accelerator", "core")],
)
def test_golden_tokens_are_unchanged(strategy, part):
  """Both strategies draw the recorded tokens, row by row: the same answer on either side of the seam.

  Each case is a compile of several seconds on CPU. The core third (every recipe on float32 rows, and every
  dtype and mask form of the mixed batch, the llama.cpp chain with every stage on in some rows) runs by
  default on both strategies; the other dtypes and mask forms of the other recipes are in the exhaustive tier.
  """
  golden = np.load(GOLDEN)
  names = []
  for name, sampler, *case in cases():
    names.append(name)
    if (part == "core") != (name.endswith("/float32/none") or name.startswith("mixed/")):
      continue
    token, valid, logprob = run_case(dataclasses.replace(sampler, strategy=strategy), *case)
    np.testing.assert_array_equal(token, golden[f"{name}/token"], err_msg=name)
    np.testing.assert_array_equal(valid, golden[f"{name}/valid"], err_msg=name)
    want = golden[f"{name}/logprob"]
    if strategy == "accelerator":
      # Flat and tied rows put top-p's boundary on an exact float32 tie (950
      # tokens of 0.001 against p = 0.95); the strategies add the mass (or the
      # log-normaliser) in different orders, so one more survivor may come in:
      # a logprob moves by up to 1/39, no token moves.
      tied = np.array([KINDS[i % len(KINDS)] in ("flat", "ties") for i in range(BATCH)])
      np.testing.assert_allclose(logprob[:, tied], want[:, tied], atol=0.03, err_msg=name)
      logprob, want = logprob[:, ~tied], want[:, ~tied]
    np.testing.assert_allclose(logprob, want, rtol=1e-6, atol=1e-6, err_msg=name)
  assert sorted(f"{n}/token" for n in names) == sorted(k for k in golden.files if k.endswith("/token"))


if __name__ == "__main__":
  record()
