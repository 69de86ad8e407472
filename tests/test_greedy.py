"""A batch of greedy rows takes one argmax-like pass: the best token of each cleaned row, as the chain gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing
from tests.helpers import CUT_KINDS, EACH_STRATEGY, cut_rows


@pytest.mark.parametrize(
  "strategy, dtype",
  [
    ("cpu", jnp.float32),
    ("cpu", jnp.bfloat16),
    ("accelerator", jnp.float32),  # the accelerator's greedy pass is its own code: in the default run
    pytest.param("accelerator", jnp.bfloat16, marks=pytest.mark.exhaustive),
  ],
)
def test_greedy_batches_give_the_best_token_of_each_cleaned_row(strategy, dtype):
  """NaN as -inf, +inf, ties to the lower id, masks, empty rows: the shortcut gives the reference's tokens."""
  rng = np.random.default_rng(5)
  vocab = 3000
  x = jnp.asarray(np.concatenate([cut_rows(rng, kind, vocab)[:3] for kind in CUT_KINDS]), dtype)
  x = x.at[-1].set(jnp.nan)  # nothing survives
  rows = np.asarray(x, np.float32)  # the values the sampler sees, for the reference
  batch = x.shape[0]
  allowed = rng.random((batch, vocab)) < 0.3
  # Penalties that touch nothing (weights neutral) and truncations that keep the best.
  sampler = jsample.llama_cpp(strategy=strategy)
  state = sampler.init(seed=np.arange(batch), prompt=rng.integers(0, vocab, (batch, 6)), temperature=0.0)
  step = jax.jit(sampler.pick_with_info)  # one program per mask form
  for mask in (None, allowed, jsample.pack_mask(allowed)):
    drawn, _ = step(x, state, mask)
    # The reference: the best of each cleaned row (NaN and masked-out ids removed), ties to the lower id.
    cleaned = np.where(np.isnan(rows), -np.inf, rows)
    if mask is not None:
      cleaned = np.where(allowed, cleaned, -np.inf)
    valid = (cleaned > -np.inf).any(axis=1)
    np.testing.assert_array_equal(drawn.valid, valid)
    assert not valid[-1]
    np.testing.assert_array_equal(np.asarray(drawn.token)[valid], np.argmax(cleaned, axis=1)[valid])
    np.testing.assert_array_equal(drawn.logprob, 0.0)


@pytest.mark.parametrize("strategy", EACH_STRATEGY)
def test_a_batch_with_one_sampled_row_takes_the_chain(strategy):
  """Greedy rows beside a sampled one, or beside active penalties, keep their tokens on the chain's path."""
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(0, 2, (4, 2000)), jnp.float32)
  sampler = jsample.gemma(strategy=strategy)
  prompt = np.argsort(-np.asarray(x), axis=1)[:, :3]  # the best tokens, so that penalties bite
  greedy = sampler.init(seed=np.arange(4), prompt=prompt, temperature=0.0)
  pick = jax.jit(sampler.pick)  # one program: the three states differ in values only
  tokens, _ = pick(x, greedy)
  np.testing.assert_array_equal(tokens, jnp.argmax(x, axis=1))
  mixed = sampler.configure(greedy, temperature=[0.0, 0.0, 0.0, 1.0])
  np.testing.assert_array_equal(pick(x, mixed)[0][:3], tokens[:3])
  penalised = sampler.configure(greedy, repeat_penalty=[1.0, 1.0, 1.0, 3.0])
  tokens, _ = pick(x, penalised)
  np.testing.assert_array_equal(tokens, jsample.testing.full_path_tokens(sampler, x, penalised))
  assert tokens[3] != jnp.argmax(x[3])  # its best was penalised away
