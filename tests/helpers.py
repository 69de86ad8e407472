"""What the test modules share, so that none imports another: neutral settings, random
rows and settings (seeded NumPy), and the chain against the float64 reference
(``tests/reference.py``) with the full-vocabulary path run alone, the chi-square test of
seeded draws, a jaxpr's equations, and the compiled programs the whole run shares.
"""

from typing import NamedTuple

import jax
import ml_dtypes
import numpy as np
import pytest
from scipy import stats

import jsample.testing
from bench.program import equations
from tests import reference

# -- neutral settings: the identity of each stage -----------------------------------

PENALTIES_OFF = dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)  # over any window
NEUTRAL_PENALTIES = dict(PENALTIES_OFF, penalty_last_n=-1)  # the recipes' defaults
# Every setting of the chain the reference runs (gemma's: penalties, top-k, top-p, min-p, temperature) at its neutral
# value, the penalties over the whole window rather than none, so that their neutral strengths are what is tested.
NEUTRAL = {**{name: s.neutral for name, s in jsample.gemma().settings.items()}, **NEUTRAL_PENALTIES}

# The strategies as test parameters. The accelerator strategy's own checks (golden tokens, every stage's
# conformance on both strategies, its structure) are in the default run; its repeats of the reference grids on a
# CPU, where each case compiles a second program that checks nothing new on a CPU, are in the exhaustive tier.
EACH_STRATEGY = [s if s == "cpu" else pytest.param(s, marks=pytest.mark.exhaustive) for s in jsample.testing.STRATEGIES]

# -- random rows ---------------------------------------------------------------------

KINDS = ("normal", "peaked", "flat", "ties", "bf16", "holes")


def row(rng: np.random.Generator, vocab: int, kind: str) -> np.ndarray:
  """One float32 row of logits of a given shape of distribution."""
  if kind == "normal":
    return rng.normal(0, rng.uniform(0.5, 4), vocab).astype(np.float32)
  if kind == "peaked":  # Zipf-like, as real language models give
    ranks = rng.permutation(vocab)
    return (-rng.uniform(0.8, 1.5) * np.log1p(ranks) + rng.normal(0, 0.1, vocab)).astype(np.float32)
  if kind == "flat":
    return np.full(vocab, rng.normal(), np.float32)
  if kind == "ties":
    return rng.integers(-3, 3, vocab).astype(np.float32)
  if kind == "bf16":
    return rng.normal(0, 3, vocab).astype(ml_dtypes.bfloat16).astype(np.float32)
  if kind == "holes":
    x = rng.normal(0, 2, vocab).astype(np.float32)
    x[rng.random(vocab) < 0.3] = -np.inf
    x[rng.random(vocab) < 0.05] = np.nan
    return x
  raise ValueError(kind)


def settings(rng: np.random.Generator, vocab: int, window: int) -> dict:
  """One row's settings: every stage independently on or off."""

  def pick(*options):
    return options[rng.integers(len(options))]

  return dict(
    repeat_penalty=pick(1.0, rng.uniform(1.0, 2.0), rng.uniform(0.5, 1.0)),
    frequency_penalty=pick(0.0, rng.uniform(0, 1), rng.uniform(-0.5, 0)),
    presence_penalty=pick(0.0, rng.uniform(0, 1), rng.uniform(-0.5, 0)),
    penalty_last_n=pick(-1, 0, int(rng.integers(1, window + 1))),
    top_k=pick(0, int(rng.integers(1, 50)), int(rng.integers(1, vocab + 5))),
    top_p=pick(1.0, rng.uniform(0.05, 1.0), rng.uniform(0.9, 1.0)),
    min_p=pick(0.0, rng.uniform(0, 0.3), rng.uniform(0, 0.02)),
    temperature=pick(0.0, rng.uniform(0.1, 2.0), 1.0),
  )


def prompt(rng: np.random.Generator, x: np.ndarray, window: int) -> list[int]:
  """Recent tokens, biased towards the row's best tokens so penalties bite."""
  length = int(rng.integers(0, 2 * window + 1))
  best = np.argsort(-np.nan_to_num(x, nan=-np.inf), kind="stable")[: max(4, window // 2)]
  pool = np.concatenate([best, rng.integers(0, x.size, 8)])
  return [int(t) for t in rng.choice(pool, length)]


# The fuzzed kinds (tests/test_properties.py): four of the kinds above as they are,
# "peaked" and "holes" of their own (a fixed Zipf slope, more NaN), and hostile ones.
FUZZ_KINDS = ("normal", "peaked", "flat", "ties", "bf16", "holes", "+inf", "huge", "subnormal", "empty", "one")


def fuzz_row(rng: np.random.Generator, vocab: int, kind: str) -> np.ndarray:
  """One float32 row of a fuzzed kind."""
  if kind in ("normal", "flat", "ties", "bf16"):
    return row(rng, vocab, kind)
  if kind == "peaked":
    return (-1.2 * np.log1p(rng.permutation(vocab)) + rng.normal(0, 0.1, vocab)).astype(np.float32)
  if kind == "holes":
    x = rng.normal(0, 2, vocab).astype(np.float32)
    x[rng.random(vocab) < 0.3] = -np.inf
    x[rng.random(vocab) < 0.1] = np.nan
    return x
  if kind == "+inf":  # one: several tie at the largest float, where top-p rounds (README)
    x = rng.normal(0, 2, vocab).astype(np.float32)
    x[rng.integers(vocab)] = np.inf
    return x
  if kind == "huge":
    return (rng.normal(0, 1, vocab) * 1e30).astype(np.float32)
  if kind == "subnormal":
    return (rng.integers(-3, 4, vocab) * 1e-45).astype(np.float32)
  if kind == "empty":
    return np.where(rng.random(vocab) < 0.5, -np.inf, np.nan).astype(np.float32)
  if kind == "one":
    x = np.full(vocab, -np.inf, np.float32)
    x[rng.integers(vocab)] = rng.normal()
    return x
  raise ValueError(kind)


CUT_KINDS = ("normal", "ties", "sparse", "nan", "infinities", "zeros")


def cut_rows(rng: np.random.Generator, kind: str, vocab: int) -> np.ndarray:
  """Three float64 rows of one kind for the two-stage cut (tests/test_cut.py): ties,
  NaN of either sign, infinities and signed zeros."""
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
  if kind == "zeros":
    x = np.zeros((3, vocab))
    x[1, ::3] = -0.0
    return x
  raise ValueError(kind)


# -- the chain against the reference -------------------------------------------------

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


def batch(seed: int, vocab: int, size: int, kinds=KINDS):
  """``size`` random rows with random settings and prompts."""
  rng = np.random.default_rng(seed)
  xs, all_settings, prompts = [], [], []
  for i in range(size):
    x = row(rng, vocab, kinds[i % len(kinds)])
    xs.append(x)
    all_settings.append(settings(rng, vocab, WINDOW))
    prompts.append(prompt(rng, x, WINDOW))
  per_row = {name: np.array([s[name] for s in all_settings]) for name in all_settings[0]}
  return np.stack(xs), all_settings, per_row, prompts


# -- compiled programs the whole run shares ----------------------------------------
# Compiling is most of the suite's time, and one program serves every setting, seed and prompt of its shapes:
# a test that needs llama.cpp's chain takes ``shared()`` at ``ROWS x VOCAB`` rather than building its own.
ROWS, VOCAB = 16, 300
# The suite compiles without LLVM's optimisation (tests/conftest.py), which suits programs that run a few small
# rows; one that runs long (Gemma's 262,144-wide rows, the soak's 1,000 steps) asks for XLA's default level back
# (``jax.jit(..., compiler_options=OPTIMISED)``): llama_cpp()'s full path on 4 Gemma-wide rows ran in 0.71 s
# unoptimised, 0.23 s optimised, for 0.5 s more compiling.
OPTIMISED = {"xla_backend_optimization_level": 2}


class Program(NamedTuple):
  """A sampler, its jitted method, and how many times that was traced (a trace is a compilation)."""

  sampler: jsample.Sampler
  run: object
  traces: list


_programs: dict = {}


def shared(method: str = "pick", recipe: str = "llama_cpp", **config) -> Program:
  """``recipe(**config)`` (window ``WINDOW`` and budget 16 unless ``config`` says) and its jitted ``method``, built
  once per pytest worker. A plain dict keeps them, not a ``functools.cache``: conftest clears those per file."""
  config = dict(window_size=WINDOW, budget=16) | config
  key = (method, recipe, tuple(sorted(config.items())))
  if key not in _programs:
    sampler = getattr(jsample, recipe)(**config)
    traces = []

    def counted(*args):
      traces.append(1)
      return getattr(sampler, method)(*args)

    _programs[key] = Program(sampler, jax.jit(counted), traces)
  return _programs[key]


def full_path_probs(sampler, x, state):
  """Probabilities from the full-vocabulary path alone, for every row."""
  return jsample.testing.full_path_probs(sampler, x, state)


def full_path_tokens(sampler, x, state):
  """The tokens the full-vocabulary path alone draws, for every row."""
  return jsample.testing.full_path_tokens(sampler, x, state)


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


# -- statistics ----------------------------------------------------------------------------


def chi_square(counts: np.ndarray, expected_probs: np.ndarray) -> float:
  """The p-value of the counts against the expected probabilities (sparse bins pooled)."""
  expected = expected_probs / expected_probs.sum() * counts.sum()
  big = expected >= 5
  observed = np.append(counts[big], counts[~big].sum())
  wanted = np.append(expected[big], expected[~big].sum())
  if wanted[-1] == 0:
    observed, wanted = observed[:-1], wanted[:-1]
  return stats.chisquare(observed, wanted).pvalue


# -- jaxprs ---------------------------------------------------------------------------------

# equations(jaxpr): every equation, branches and loop bodies included (bench.program counts them the same way).


def primitives(jaxpr) -> list[str]:
  return [eqn.primitive.name for eqn in equations(jaxpr)]


def assert_one_cond(jaxpr) -> list:
  """The accelerator strategy's shape, as a GPU needs it: no ``while`` (a loop whose predicate the host reads) and
  one ``cond``, around the rare full path, which holds every fixed-length loop (``scan``) there is.
  Returns the equations outside it: the work every call does."""
  every = primitives(jaxpr)
  assert "while" not in every and every.count("cond") == 1, f"{every.count('while')} while, {every.count('cond')} cond"
  (rare,) = [eqn for eqn in equations(jaxpr) if eqn.primitive.name == "cond"]
  inside = {id(eqn) for branch in rare.params["branches"] for eqn in equations(branch.jaxpr)}
  common = [eqn for eqn in equations(jaxpr) if id(eqn) not in inside and eqn is not rare]
  assert "scan" not in [eqn.primitive.name for eqn in common], "a loop outside the rare path"
  return common
