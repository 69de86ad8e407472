"""A slow, obviously-correct NumPy reference of the chain (the test oracle).

It follows DESIGN.md section 1 literally: sort the row, walk the stages in
order, softmax what survives. The penalty arithmetic runs in float32, as in
llama.cpp (that is the spec); everything else in float64.

Stages are ``(name, value)`` pairs: ``("penalties", dict(repeat=, frequency=,
presence=, last_n=))``, ``("top_k", k)``, ``("top_p", p)``, ``("min_p", p)``,
``("temperature", t)``; top-p and min-p also take ``(p, min_keep)``.
"""

import numpy as np


def sampling_order(x: np.ndarray) -> np.ndarray:
  """Indices sorted by value descending, then id ascending."""
  return np.lexsort((np.arange(x.size), -x))


def penalise(x: np.ndarray, window: list[int], repeat, frequency, presence, last_n) -> np.ndarray:
  """llama.cpp's penalties, in float32; ``window`` holds recent tokens, oldest first."""
  n = len(window) if last_n < 0 else min(last_n, len(window))
  recent = window[len(window) - n :]
  x = x.astype(np.float32).copy()
  f32 = np.float32
  with np.errstate(over="ignore", invalid="ignore"):  # the largest float / 0.5 and the like
    for token in set(recent):
      if not 0 <= token < x.size:
        continue
      count = recent.count(token)
      logit = x[token]
      logit = logit * f32(repeat) if logit <= 0 else logit / f32(repeat)
      x[token] = logit - (f32(count) * f32(frequency) + f32(1.0) * f32(presence))
    # jsample keeps the row's range: up to the largest float, inf - inf removed.
    x = np.where(np.isnan(x), -np.inf, np.minimum(x, np.finfo(np.float32).max))
  return x


def survivors_and_logits(logits, stages, *, window=(), mask=None, nudge=0.0):
  """Runs the chain; returns (alive [V] bool, final logits [V] float64).

  ``nudge`` widens (> 0) or narrows (< 0) top-p and min-p by a relative
  amount, to bound survivor sets whose boundary lies within rounding.
  """
  x = np.asarray(logits, np.float32).copy()
  x[np.isnan(x)] = -np.inf
  if mask is not None:
    x[~np.asarray(mask, bool)] = -np.inf
  window = [int(t) for t in window]
  alive = x > -np.inf
  y = x.astype(np.float64)
  for name, value in stages:
    if name == "penalties":
      y = penalise(x, window, **value).astype(np.float64)
      y[~alive] = -np.inf
      continue
    if not alive.any():
      continue
    order = sampling_order(np.where(alive, y, -np.inf))
    order = order[alive[order]]
    if name == "top_k":
      if 0 < value < x.size:
        alive[order[value:]] = False
    elif name == "top_p":
      value, least = value if isinstance(value, tuple) else (value, 0)
      p = value * (1 + nudge)
      if value < 1:
        probs = np.exp(y[order] - np.max(y[order]))
        probs /= probs.sum()
        reached = np.nonzero((np.cumsum(probs) >= p) & (np.arange(order.size) + 1 >= least))[0]
        if reached.size:
          alive[order[reached[0] + 1 :]] = False
    elif name == "min_p":
      value, least = value if isinstance(value, tuple) else (value, 0)
      p = value * (1 - nudge)
      if p > 0:
        alive &= y >= y[order[0]] + np.log(p)
        alive[order[:least]] = True
    elif name == "temperature":
      if value <= 0:
        alive[order[1:]] = False
      else:
        y = y / value
    else:
      raise ValueError(name)
    y = np.where(alive, y, -np.inf)
  return alive, np.where(alive, y, -np.inf)


def probabilities(logits, stages, **kwargs) -> np.ndarray:
  """The final distribution ``[V]`` in float64; zeros when nothing survives."""
  alive, y = survivors_and_logits(logits, stages, **kwargs)
  out = np.zeros(y.shape, np.float64)
  if alive.any():
    e = np.exp(y[alive] - y[alive].max())
    out[alive] = e / e.sum()
  return out
