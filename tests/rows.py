"""Random rows and settings for the conformance tests (seeded NumPy)."""

import ml_dtypes
import numpy as np

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
