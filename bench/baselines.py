"""The algorithms other JAX engines sample with, written from their published descriptions.

Each baseline runs the temperature-first chain of transformers and vLLM
(temperature, then top-k, then top-p) on a batch ``[B, V]`` with the same
settings for every row, and exposes two functions:

- ``probs(logits, temperature, top_k, top_p) -> [B, V]``: the distribution it
  draws from (tested against jsample's float64 reference in
  ``tests/test_bench.py``);
- ``sample(key, logits, temperature, top_k, top_p) -> [B]``: one draw per row.

``top_k <= 0`` and ``top_p >= 1`` switch a stage off; ``temperature`` must be
positive (every engine routes greedy rows elsewhere). The settings are static
Python numbers, as they are in those engines' compiled programs.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Baseline(NamedTuple):
  name: str
  description: str
  probs: object
  sample: object


def _sample_from(probs_fn):
  def sample(key, logits, temperature, top_k, top_p):
    p = probs_fn(logits, temperature, top_k, top_p)
    return jax.random.categorical(key, jnp.log(p), axis=-1).astype(jnp.int32)

  return sample


# -- full sort (JetStream, Gemma's sampler, HF Flax) ----------------------------


def sort_probs(logits, temperature, top_k, top_p):
  """Sort the whole row descending, cut by rank and by cumulative mass, scatter back."""
  x = logits.astype(jnp.float32) / temperature
  batch, vocab = x.shape
  ids = jnp.broadcast_to(jnp.arange(vocab, dtype=jnp.int32), x.shape)
  # A stable sort on the negated logits puts ties in id order.
  neg_sorted, order = lax.sort((-x, ids), dimension=-1, num_keys=1, is_stable=True)
  ranked = -neg_sorted
  rank = jnp.arange(vocab)
  if 0 < top_k < vocab:
    ranked = jnp.where(rank < top_k, ranked, -jnp.inf)
  p = jax.nn.softmax(ranked, axis=-1)
  if top_p < 1:
    before = jnp.cumsum(p, axis=-1) - p  # mass strictly before each token
    ranked = jnp.where(before < top_p, ranked, -jnp.inf)
    p = jax.nn.softmax(ranked, axis=-1)
  rows = jnp.arange(batch)[:, None]
  return jnp.zeros_like(p).at[rows, order].set(p)


# -- threshold search over the float bit pattern (t5x, vLLM's TPU backend) ------


def _order_key(x):
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  return jnp.where((bits >> 31) == 1, ~bits, bits | jnp.uint32(0x80000000))


def _threshold(key, weight, target):
  """The largest key whose upper set still weighs ``target``: 32 passes, one bit each."""

  def step(i, bound):
    trial = bound | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    mass = jnp.sum(jnp.where(key >= trial[:, None], weight, 0), axis=-1)
    return jnp.where(mass >= target, trial, bound)

  return lax.fori_loop(0, 32, step, jnp.zeros(key.shape[:1], jnp.uint32))


def bitsearch_probs(logits, temperature, top_k, top_p):
  """Binary-search the k-th largest logit and the top-p boundary; keep everything at or above them.

  Ties at a boundary all survive (the search finds a value, not an id).
  """
  x = logits.astype(jnp.float32) / temperature
  key = _order_key(x)
  if 0 < top_k < x.shape[-1]:
    kth = _threshold(key, jnp.ones_like(x), jnp.float32(top_k))
    x = jnp.where(key >= kth[:, None], x, -jnp.inf)
    key = _order_key(x)
  p = jax.nn.softmax(x, axis=-1)
  if top_p < 1:
    crossing = _threshold(key, p, jnp.float32(top_p))
    x = jnp.where(key >= crossing[:, None], x, -jnp.inf)
    p = jax.nn.softmax(x, axis=-1)
  return p


# -- lax.top_k, then masking (MaxText, vLLM's TPU top-k path) ------------------


def topk_probs(logits, temperature, top_k, top_p):
  """``lax.top_k`` to ``top_k`` candidates, top-p among them, scatter back.

  Needs top-k on: without it the candidates cannot be bounded.
  """
  x = logits.astype(jnp.float32) / temperature
  batch, vocab = x.shape
  if not 0 < top_k <= vocab:
    raise ValueError("the lax.top_k baseline needs 0 < top_k <= V")
  values, ids = lax.top_k(x, top_k)
  p = jax.nn.softmax(values, axis=-1)
  if top_p < 1:
    values = jnp.where(jnp.cumsum(p, axis=-1) - p < top_p, values, -jnp.inf)
    p = jax.nn.softmax(values, axis=-1)
  rows = jnp.arange(batch)[:, None]
  return jnp.zeros_like(x).at[rows, ids].set(p)


def topk_sample(key, logits, temperature, top_k, top_p):
  """Draws among the ``top_k`` candidates only: ``O(k)`` after the selection."""
  x = logits.astype(jnp.float32) / temperature
  values, ids = lax.top_k(x, top_k)
  p = jax.nn.softmax(values, axis=-1)
  if top_p < 1:
    values = jnp.where(jnp.cumsum(p, axis=-1) - p < top_p, values, -jnp.inf)
  pick = jax.random.categorical(key, values, axis=-1)
  return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]


BASELINES = (
  Baseline("full sort", "sort the row (JetStream, Gemma, HF Flax)", sort_probs, _sample_from(sort_probs)),
  Baseline(
    "bit search", "32-step float-bit binary search (t5x, vLLM TPU)", bitsearch_probs, _sample_from(bitsearch_probs)
  ),
  Baseline("lax.top_k", "lax.top_k then mask (MaxText, vLLM TPU top-k)", topk_probs, topk_sample),
)
