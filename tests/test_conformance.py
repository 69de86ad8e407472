"""Every built-in stage through the public conformance suite, against the float64 reference."""

import numpy as np
import pytest

import jsample
import jsample.testing
from tests import reference


def _one_stage(name: str, value):
  def run(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
    _, y = reference.survivors_and_logits(x, [(name, value(s))], window=window)
    return y

  return run


def _penalty_weights(s: dict) -> dict:
  return dict(
    repeat=s["repeat_penalty"],
    frequency=s["frequency_penalty"],
    presence=s["presence_penalty"],
    last_n=s["penalty_last_n"],
  )


# Settings away from float32 rounding boundaries (the reference is float64).
CASES = {
  "top_k": (jsample.top_k(), "top_k", [dict(top_k=1), dict(top_k=7), dict(top_k=0), dict(top_k=400)]),
  "top_p": (
    jsample.top_p(),
    "top_p",
    [
      dict(top_p=0.5123, min_keep=0),
      dict(top_p=1.0, min_keep=0),
      dict(top_p=0.9071, min_keep=0),
      dict(top_p=1e-4, min_keep=0),
      dict(top_p=0.3017, min_keep=6),
      dict(top_p=1e-4, min_keep=1),
      dict(top_p=0.7013, min_keep=400),
    ],
  ),
  "min_p": (
    jsample.min_p(),
    "min_p",
    [
      dict(min_p=0.0513, min_keep=0),
      dict(min_p=0.0, min_keep=0),
      dict(min_p=0.3071, min_keep=0),
      dict(min_p=1.0, min_keep=0),
      dict(min_p=0.6017, min_keep=5),
      dict(min_p=1.0, min_keep=2),
      dict(min_p=0.2011, min_keep=400),
    ],
  ),
  "temperature": (
    jsample.temperature(),
    "temperature",
    [dict(temperature=0.7), dict(temperature=0.0), dict(temperature=1.6), dict(temperature=1.0)],
  ),
  "penalties": (
    jsample.penalties(),
    None,
    [
      dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=-1),
      dict(repeat_penalty=0.8, frequency_penalty=-0.3, presence_penalty=-0.2, penalty_last_n=5),
      dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, penalty_last_n=0),
      dict(repeat_penalty=2.0, frequency_penalty=0.0, presence_penalty=0.5, penalty_last_n=3),
    ],
  ),
}


def _top_n_sigma(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  """llama.cpp's top-n-σ in float64: the population std of the finite logits."""
  finite = x > -np.inf
  if s["top_n_sigma"] <= 0 or not finite.any():
    return x
  return np.where(x >= x[finite].max() - s["top_n_sigma"] * x[finite].std(), x, -np.inf)


@pytest.mark.parametrize("name", sorted(CASES))
def test_builtin_stage_conforms(name):
  stage, setting, settings = CASES[name]
  if setting is None:
    ref = _one_stage("penalties", _penalty_weights)
  else:
    ref = _one_stage(name, lambda s, setting=setting: (s[setting], s["min_keep"]) if "min_keep" in s else s[setting])
  jsample.testing.assert_stage_conforms(stage, ref, settings)


@pytest.mark.exhaustive
def test_penalties_conform_past_the_pairwise_window():
  """Past 128 tokens the candidates look the window's tokens up (a sort of the candidates and a search)
  instead of comparing every pair. (The default run reaches that branch through OpenAI's scope at W 160 in
  test_penalty_scopes, which fails as this does when each occurrence counts twice.)"""
  stage, _, settings = CASES["penalties"]
  ref = _one_stage("penalties", _penalty_weights)
  jsample.testing.assert_stage_conforms(stage, ref, settings, window_size=160)


def test_top_n_sigma_conforms():
  settings = [dict(top_n_sigma=1.013), dict(top_n_sigma=0.0), dict(top_n_sigma=2.517), dict(top_n_sigma=0.331)]
  jsample.testing.assert_stage_conforms(jsample.top_n_sigma(), _top_n_sigma, settings)


def test_the_suite_catches_a_wrong_stage():
  """A stage whose full path disagrees with its candidate path fails the suite."""
  good = jsample.top_k()
  wrong = good._replace(on_row=lambda logits, s, ctx: logits)  # forgets to cut on the full path
  ref = _one_stage("top_k", lambda s: s["top_k"])
  with pytest.raises(AssertionError, match="top_k"):
    jsample.testing.assert_stage_conforms(wrong, ref, [dict(top_k=3)], draws=0)
