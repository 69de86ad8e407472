"""Log-probabilities under the model's own distribution, against a float64 log-softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from tests.helpers import CUT_KINDS, EACH_STRATEGY, cut_rows


def reference(x: np.ndarray, token: int, n: int):
  """``(logprob, rank, top_ids, top_logprobs)`` of one float64 row, NaN as -inf, ties to the lower id."""
  x = np.where(np.isnan(x), -np.inf, x)
  x = np.minimum(x, np.finfo(np.float32).max)
  top = x.max()
  log_z = top + np.log(np.sum(np.exp(x - top)))
  order = np.lexsort((np.arange(x.size), -x))
  rank = 1 + np.sum((x > x[token]) | ((x == x[token]) & (np.arange(x.size) < token)))
  return x[token] - log_z, rank, order[:n], x[order[:n]] - log_z


@pytest.mark.parametrize("strategy", EACH_STRATEGY)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_raw_logprobs_rank_and_alternatives_follow_the_reference(strategy, dtype):
  rng = np.random.default_rng(11)
  vocab = 3000
  x = jnp.asarray(np.concatenate([cut_rows(rng, kind, vocab)[:2] for kind in CUT_KINDS]), dtype)
  batch = x.shape[0]
  allowed = rng.random((batch, vocab)) < 0.5
  allowed[:, :5] = True
  sampler = jsample.llama_cpp(strategy=strategy, top_k=0, min_p=0.0, temperature=1.3)
  state = sampler.init(seed=np.arange(batch))
  per_row = rng.integers(0, 6, batch)
  drawn, _ = jax.jit(lambda x, s, m, n: sampler.pick_with_info(x, s, m, top_logprobs=(5, n)))(
    x, state, allowed, per_row
  )
  rows = np.asarray(x.astype(jnp.float32), np.float64)
  for i in range(batch):
    if not drawn.valid[i]:
      assert np.isnan(drawn.raw.logprob[i]) and drawn.raw.rank[i] == 0
      continue
    logprob, rank, ids, values = reference(rows[i], int(drawn.token[i]), 5)
    np.testing.assert_allclose(drawn.raw.logprob[i], logprob, rtol=1e-5, atol=1e-5, err_msg=str(i))
    assert drawn.raw.rank[i] == rank, i
    n = per_row[i]
    np.testing.assert_array_equal(drawn.raw.top_ids[i, :n], ids[:n], err_msg=str(i))
    np.testing.assert_allclose(drawn.raw.top_logprobs[i, :n], values[:n], rtol=1e-5, atol=1e-5, err_msg=str(i))
    assert (drawn.raw.top_ids[i, n:] == -1).all() and (drawn.raw.top_logprobs[i, n:] == -np.inf).all()


def test_the_raw_distribution_ignores_the_chain_and_the_mask():
  """The processed logprob is the chain's; the raw one is the model's, mask or no mask."""
  x = jnp.log(jnp.array([0.1, 0.6, 0.3]))
  sampler = jsample.llama_cpp(top_k=1)
  state = sampler.init(seed=0)
  drawn, _ = sampler.pick_with_info(x, state, jnp.array([True, False, True]), top_logprobs=3)
  assert int(drawn.token) == 2 and float(drawn.logprob) == 0.0  # top-k 1 of what the mask left
  np.testing.assert_allclose(drawn.raw.logprob, np.log(0.3), rtol=1e-6)
  assert int(drawn.raw.rank) == 2
  np.testing.assert_array_equal(drawn.raw.top_ids, [1, 2, 0])
  assert sampler.pick_with_info(x, state)[0].raw is None  # not asked for: not computed


def test_vmap_of_pick_with_info_gives_the_batched_logprobs():
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(0, 2, (4, 500)), jnp.float32)
  sampler = jsample.gemma()
  state = sampler.init(seed=np.arange(4))
  batched, _ = jax.jit(lambda x, s: sampler.pick_with_info(x, s, top_logprobs=3))(x, state)
  mapped, _ = jax.jit(jax.vmap(lambda x, s: sampler.pick_with_info(x, s, top_logprobs=3)))(x, state)
  jax.tree.map(np.testing.assert_array_equal, mapped, batched)
