"""Epsilon and eta sampling (transformers' warpers) against float64 references."""

import numpy as np

import jsample
import jsample.testing


def _floor_cut(x: np.ndarray, floor, least: int) -> np.ndarray:
  """transformers: drop ``p < floor`` unless the score reaches the ``min_tokens_to_keep``-th best."""
  alive = x > -np.inf
  if not alive.any():
    return x
  p = np.where(alive, np.exp(x - x[alive].max()), 0)
  p /= p.sum()
  k = min(max(least, 1), x.size)
  kth = np.sort(x)[::-1][k - 1]
  return np.where((p >= floor(p)) | (x >= kth), x, -np.inf)


def epsilon_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  if s["epsilon_cutoff"] <= 0:
    return x
  return _floor_cut(x, lambda p: s["epsilon_cutoff"], int(s["min_keep"]))


def eta_reference(x: np.ndarray, s: dict, window: list[int]) -> np.ndarray:
  e = s["eta_cutoff"]
  if e <= 0:
    return x

  def floor(p):
    live = p[p > 0]
    h = -(live * np.log(live)).sum()
    return min(e, np.sqrt(e) * np.exp(-h))

  return _floor_cut(x, floor, int(s["min_keep"]))


def test_epsilon_conforms():
  settings = [
    dict(epsilon_cutoff=1.07e-3, min_keep=0),
    dict(epsilon_cutoff=0.0, min_keep=0),
    dict(epsilon_cutoff=3.1e-2, min_keep=5),
    dict(epsilon_cutoff=0.9, min_keep=3),
    dict(epsilon_cutoff=1.3e-4, min_keep=1),
  ]
  jsample.testing.assert_stage_conforms(jsample.epsilon(), epsilon_reference, settings)


def test_eta_conforms():
  settings = [
    dict(eta_cutoff=2e-3, min_keep=0),
    dict(eta_cutoff=0.0, min_keep=0),
    dict(eta_cutoff=0.2, min_keep=4),
    dict(eta_cutoff=0.9, min_keep=1),
    dict(eta_cutoff=3e-4, min_keep=2),
  ]
  jsample.testing.assert_stage_conforms(jsample.eta(), eta_reference, settings)


def test_min_keep_keeps_every_tie_of_the_kth_best():
  # transformers keeps scores >= the k-th best score, ties included.
  sampler = jsample.chain(jsample.epsilon(0.5, min_keep=2), jsample.temperature(1.0))
  p = sampler.probs(np.array([3.0, 1.0, 1.0, 0.0], np.float32), sampler.init(seed=0))
  assert np.count_nonzero(np.asarray(p)) == 3
