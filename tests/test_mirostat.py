"""Mirostat v1 and v2 against float64 NumPy references: the truncation, mu's trajectory, accept."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from tests import reference

F32 = np.float32


def _order(x: np.ndarray) -> np.ndarray:
  order = reference.sampling_order(x)
  return order[x[order] > -np.inf]


def zipf_k(x: np.ndarray, mu: float, vocab: int) -> float:
  """llama.cpp's v1 ``k`` in float64, with ``b_i`` the logit difference (jsample's reading)."""
  best = x[_order(x)][:100]
  pairs = min(99, best.size - 1)
  if pairs < 1:
    return 1.0
  i = np.arange(pairs, dtype=np.float64)
  t = np.log((i + 2) / (i + 1))
  s_hat = np.sum(t * (best[:-1][:pairs] - best[1:][:pairs])) / np.sum(t * t)
  eps = s_hat - 1
  with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
    ratio = 2.0**mu / math.log(vocab) if eps == 0 else eps * 2.0**mu / (1 - float(vocab) ** -eps)
    k = ratio ** (1 / s_hat)
  return 1.0 if np.isnan(k) else max(math.floor(k) if np.isfinite(k) else np.inf, 1.0)


def keep(x: np.ndarray, version: int, mu: float, vocab: int) -> np.ndarray:
  """One row's logits after mirostat ``version`` with this ``mu`` (float64)."""
  order = _order(x)
  if version == 0 or not order.size:
    return x
  y = np.full(x.shape, -np.inf)
  if version == 1:
    kept = order[: int(min(zipf_k(x, mu, vocab), order.size))]
  else:
    alive = x[order]
    log_p = alive - (alive.max() + np.log(np.sum(np.exp(alive - alive.max()))))
    kept = order[-log_p / np.log(2) <= mu]
    kept = kept if kept.size else order[:1]
  y[kept] = x[kept]
  return y


def step_mu(mu, p, tau, eta):
  """llama.cpp's update, in float32: ``mu - eta * (-log2 p - tau)``."""
  return F32(F32(mu) - F32(eta) * (F32(-np.log2(p)) - F32(tau)))


def _stage_reference(x, s, window):
  return keep(x, int(s["mirostat"]), 2 * float(F32(s["mirostat_tau"])), x.size)


def test_mirostat_conforms():
  settings = [
    dict(mirostat=2, mirostat_tau=3.0),
    dict(mirostat=1, mirostat_tau=5.0),
    dict(mirostat=0, mirostat_tau=5.0),
    dict(mirostat=2, mirostat_tau=0.75),
    dict(mirostat=1, mirostat_tau=1.5),
    dict(mirostat=2, mirostat_tau=-1.0),  # mu < 0: only the best survives
  ]
  jsample.testing.assert_stage_conforms(jsample.mirostat(), _stage_reference, settings)


def _rows(rng, batch, vocab):
  x = rng.normal(0, 2.5, (batch, vocab))
  x[:, ::7] = np.round(x[:, ::7])  # ties
  return x.astype(np.float32)


@pytest.mark.parametrize("strategy", jsample.testing.STRATEGIES)
@pytest.mark.parametrize("budget", [8, 128])
def test_mu_follows_the_reference_step_by_step_in_a_scan(strategy, budget):
  """Rows with mirostat 0, 1 and 2 in one program: each draw is allowed by the
  reference at that step's mu, and mu moves by the drawn token's surprise."""
  rng = np.random.default_rng(1)
  steps, vocab, temp = 12, 500, 0.9
  versions, taus = np.array([1, 2, 2, 0, 1]), np.array([3.0, 3.0, 1.5, 5.0, 6.0])
  etas = np.array([0.1, 0.3, 0.5, 0.1, 1.0])
  batch = versions.size
  xs = np.stack([_rows(rng, batch, vocab) for _ in range(steps)])
  sampler = jsample.chain(jsample.temperature(temp), jsample.mirostat(), budget=budget, strategy=strategy)
  state = sampler.init(seed=np.arange(batch), mirostat=versions, mirostat_tau=taus, mirostat_eta=etas)

  def body(state, x):
    probs = sampler.probs(x, state)
    token, state = sampler.pick(x, state)
    return state, (token, probs, state.stages["mirostat"])

  final, (tokens, probs, mus) = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(state, jnp.asarray(xs))
  tokens, probs, mus = np.asarray(tokens), np.asarray(probs), np.asarray(mus)
  for row in range(batch):
    mu = F32(2 * F32(taus[row]))
    for t in range(steps):
      tempered = xs[t, row].astype(np.float32) / F32(temp)
      ref = lambda x, s, w, v=versions[row], mu=float(mu): keep(x, v, mu, vocab)  # noqa: E731
      want = jsample.testing.reference_probs(ref, tempered, {}, [])
      np.testing.assert_allclose(probs[t, row], want, atol=2e-5, err_msg=f"row {row} step {t}")
      p = want[tokens[t, row]]
      assert p > 0, f"row {row} step {t}: token {tokens[t, row]} is not a survivor"
      if versions[row]:
        mu = step_mu(mu, p, taus[row], etas[row])
        np.testing.assert_allclose(mus[t, row], mu, rtol=1e-5, atol=1e-5, err_msg=f"row {row} step {t}")
      else:
        assert np.isnan(mus[t, row])  # off: never moved
  # accept: the token did not come from mirostat, so mu stays (llama.cpp has no accept hook).
  accepted = sampler.accept(jnp.asarray(tokens[-1]), final)
  np.testing.assert_array_equal(accepted.stages["mirostat"], final.stages["mirostat"])
  np.testing.assert_array_equal(accepted.position, final.position + 1)


def test_first_mu_is_two_tau_and_configure_moves_it_before_the_first_draw():
  sampler = jsample.chain(jsample.temperature(1.0), jsample.mirostat(2, tau=1.0))
  logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
  state = sampler.configure(sampler.init(seed=0), mirostat_tau=2.0)  # mu = 4 bits: p >= 1/16 survive
  np.testing.assert_allclose(sampler.probs(logits, state), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], atol=1e-6)


def test_greedy_before_mirostat_raises_mu_by_eta_tau():
  """Temperature 0 leaves one token of p = 1, surprise 0: mu += eta * tau, as in llama.cpp."""
  sampler = jsample.chain(jsample.temperature(0.0), jsample.mirostat(2, tau=5.0, eta=0.1))
  token, state = sampler.pick(jnp.array([0.0, 2.0, 1.0]), sampler.init(seed=3))
  assert int(token) == 1
  np.testing.assert_allclose(state.stages["mirostat"], 10.5, rtol=1e-6)


def _llama_cpp_v1_k(x: np.ndarray, mu: float, vocab: int) -> int:
  """llama.cpp's v1 literally, float32, with x86's int(NaN or > INT_MAX) = INT_MIN."""
  order = reference.sampling_order(x)  # every entry, -inf included, as llama.cpp's array
  e = np.exp((x[order] - x[order[0]]).astype(F32), dtype=F32)
  p = e / np.sum(e, dtype=F32)
  sum_tb = sum_tt = F32(0)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    for i in range(min(99, x.size - 1)):
      t = np.log(F32(i + 2) / F32(i + 1), dtype=F32)
      sum_tb = F32(sum_tb + t * np.log(p[i] / p[i + 1], dtype=F32))
      sum_tt = F32(sum_tt + t * t)
    s_hat = F32(sum_tb / sum_tt)
    eps = F32(s_hat - 1)
    k = np.power(F32(eps * np.power(F32(2), F32(mu))) / F32(1 - np.power(F32(vocab), -eps)), F32(1) / s_hat)
  k = -(2**31) if not np.isfinite(k) or k >= 2**31 else int(k)
  return max(k, 1)


def _v1_kept(sampler, x):
  return int(np.sum(np.asarray(sampler.probs(jnp.asarray(x), sampler.init(seed=0))) > 0))


def test_v1_where_llama_cpp_is_right_it_agrees():
  rng = np.random.default_rng(4)
  sampler = jsample.chain(jsample.mirostat(1, tau=3.0), budget=256)
  for _ in range(5):
    x = -1.1 * np.log1p(rng.permutation(1000)) + rng.normal(0, 0.05, 1000)  # Zipf-like, every p > 0
    x = x.astype(np.float32)
    want = _llama_cpp_v1_k(x, 6.0, x.size)
    assert abs(_v1_kept(sampler, x) - want) <= 1  # float32 rounding of k's floor
    assert _v1_kept(sampler, x) == min(zipf_k(x, 6.0, x.size), x.size)


def test_v1_where_llama_cpp_overflows_keeps_all():
  """A flat head makes s_hat tiny and k astronomically large: llama.cpp's int(k)
  overflows to INT_MIN and it keeps 1 token; the formula keeps them all."""
  x = np.zeros(300, np.float32)
  x[:150] = np.linspace(0.0, -0.01, 150)
  x[150:] = -0.01 - np.arange(150) * 1e-3
  assert _llama_cpp_v1_k(x, 10.0, x.size) == 1
  assert zipf_k(x, 10.0, x.size) > 2**31
  assert _v1_kept(jsample.chain(jsample.mirostat(1, tau=5.0)), x) == 300


def test_v1_with_fewer_than_100_survivors_fits_the_survivors():
  """Banned tokens (-inf) have p = 0: llama.cpp's log(0 / 0) makes s_hat NaN and
  keeps 1 token; jsample fits the survivors only."""
  rng = np.random.default_rng(7)
  x = (-1.2 * np.log1p(rng.permutation(400))).astype(np.float32)
  x[np.argsort(-x)[40:]] = -np.inf  # 40 survivors, as after a grammar mask
  assert _llama_cpp_v1_k(x, 10.0, x.size) == 1
  want = min(zipf_k(x, 10.0, x.size), 40)
  assert want > 1
  assert _v1_kept(jsample.chain(jsample.mirostat(1, tau=5.0)), x) == want
