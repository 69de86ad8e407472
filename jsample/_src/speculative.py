"""Speculative decoding: a draft's tokens checked against the target's logits.

A cheap draft model proposes ``L`` tokens with probabilities ``q``; the target
model scores all of them in one call, giving ``L + 1`` rows of logits. Draft
token ``x_j`` is kept with probability ``min(1, p_j(x_j) / q_j(x_j))``, where
``p_j`` is the distribution :meth:`Sampler.pick` would draw from at that
position; the first token refused is replaced by a draw from
``norm(max(0, p_j - q_j))``, and a draft kept whole earns a bonus token from
the target's last row. Every emitted token then follows ``p_j`` exactly
(Leviathan et al. 2023; Chen et al. 2023).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src import run, validation
from jsample._src.draw import Draw
from jsample._src.kernels import masks, noise
from jsample._src.kernels import strategy as strategies
from jsample._src.state import SamplerState

# The verifier's own stream at a step is fold_in(step key, _TAG): its coin and
# its correction draw never reuse the noise of the draw at that position.
_TAG = 0x5BEC


def verifier_bits(key: jax.Array, position: jax.Array) -> jax.Array:
  """One row's verifier bits at ``position``: four uint32 from the verifier's own stream, a coin's and a race's.

  Not :func:`noise.step_bits`: a stream of its own (see ``_TAG``).

  Args:
    key: a typed PRNG key ``[]``.
    position: the position the token would take ``[]``.

  Returns:
    ``[4]`` uint32: entries 0 and 1 make the coin, entries 2 and 3 are the correction race's step bits.
  """
  step = jax.random.fold_in(jax.random.fold_in(key, position), _TAG)
  return jax.random.bits(step, (4,), jnp.uint32)


def verify(sampler, draft_tokens, draft_probs, target_logits, state: SamplerState, mask, inputs: dict):
  """:meth:`Sampler.verify` on a batch or a single row; see there."""
  draft_tokens, target_logits = jnp.asarray(draft_tokens), jnp.asarray(target_logits)
  single = target_logits.ndim == 2
  if single:
    draft_tokens, target_logits, state = jax.tree.map(lambda a: a[None], (draft_tokens, target_logits, state))
    draft_probs, mask, inputs = jax.tree.map(lambda a: jnp.asarray(a)[None], (draft_probs, mask, inputs))
  _check(sampler, draft_tokens, draft_probs, target_logits, state, mask, inputs)
  arrays = (draft_tokens, draft_probs, target_logits, state, mask, inputs)
  batch = run.compiled(sampler, _batch) if run.outside_jit(sampler, arrays) else functools.partial(_batch, sampler)
  tokens, accepted, state = batch(*arrays)
  if single:
    tokens, accepted, state = jax.tree.map(lambda a: a[0], (tokens, accepted, state))
  return tokens, accepted, state


def _check(sampler, draft_tokens, draft_probs, target_logits, state, mask, inputs) -> None:
  if target_logits.ndim != 3:
    raise ValueError(f"target_logits: must be [L + 1, V] or [B, L + 1, V]; got shape {target_logits.shape}")
  rows, steps, vocab = target_logits.shape
  validation.logits(target_logits[:, 0], sampler.vocab_size)
  if not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
    raise ValueError(f"draft_tokens: must be integer token ids; got dtype {draft_tokens.dtype}")
  if draft_tokens.shape != (rows, steps - 1):
    raise ValueError(
      f"draft_tokens: must have shape {(rows, steps - 1)[2 - draft_tokens.ndim :]} for target_logits of shape "
      f"{target_logits.shape[2 - draft_tokens.ndim :]} (one row more than the draft); got {draft_tokens.shape}"
    )
  validation.tokens("draft_tokens", draft_tokens, vocab, lowest=0)
  if draft_probs is not None:
    draft_probs = jnp.asarray(draft_probs)
    if draft_probs.shape != (rows, steps - 1, vocab) or not jnp.issubdtype(draft_probs.dtype, jnp.floating):
      raise ValueError(
        f"draft_probs: must be float probabilities of shape {(rows, steps - 1, vocab)} (batched like "
        f"draft_tokens, over the vocabulary); got {draft_probs.dtype} {draft_probs.shape}"
      )
  if state.position.shape != (rows,):
    raise ValueError(f"state: holds rows of shape {state.position.shape}; the draft needs {(rows,)}")
  for name, value in dict(inputs, mask=mask).items():
    if value is not None and np.shape(value)[:2] != (rows, steps):
      raise ValueError(f"{name}: must have one entry per target row, {(rows, steps)} + ...; got {np.shape(value)}")
  if mask is not None:
    masks.check(jnp.asarray(mask)[:, 0], target_logits[:, 0].shape)


def _at(tree, j):
  """Every array of ``tree`` at step ``j`` of its second axis."""
  return jax.tree.map(lambda a: lax.dynamic_index_in_dim(jnp.asarray(a), j, axis=1, keepdims=False), tree)


def _gather(values: jax.Array, ids: jax.Array) -> jax.Array:
  """``values[b, ids[b]]`` for every row ``b``."""
  return jnp.take_along_axis(values, ids[:, None], axis=1)[:, 0]


def _choose(take: jax.Array, a, b):
  """Per row, ``a`` where ``take`` else ``b``: pytrees batched over ``take``'s axis."""
  return jax.tree.map(lambda x, y: jnp.where(take.reshape(take.shape + (1,) * (x.ndim - 1)), x, y), a, b)


def _batch(sampler, draft_tokens, draft_probs, target_logits, state: SamplerState, mask, inputs):
  rows, steps, vocab = target_logits.shape
  given = dict(inputs, mask=mask)
  last = _at(given, steps - 1)
  if steps == 1:  # no draft: a pick
    token, state = sampler.pick(target_logits[:, 0], state, last.pop("mask"), **last)
    return token[:, None], jnp.zeros(rows, jnp.int32), state
  draft_tokens = draft_tokens.astype(jnp.int32)
  strategy = strategies.resolve(sampler.strategy)

  def track(state: SamplerState):
    # What a step changes: the key and the settings stay as they are.
    return state.window, state.position, state.stages

  def step(carry, j):
    state, accepted, refused, p_at, track_at = carry
    x = lax.dynamic_index_in_dim(draft_tokens, j, axis=1, keepdims=False)
    now = _at(given, j)
    p = run.probs(sampler, _at(target_logits, j), state, now)
    p_x = _gather(p, x)
    q_x = jnp.ones_like(p_x) if draft_probs is None else _gather(_at(draft_probs, j), x).astype(jnp.float32)
    bits = jax.vmap(verifier_bits)(state.key, state.position)
    coin = noise.unit_interval(bits[:, 0], bits[:, 1])
    # u < p / q without the division: where q(x) = 0, any x the target allows is kept.
    kept = coin * q_x < p_x
    first = ~refused & ~kept
    p_at, track_at = _choose(first, (p, track(state)), (p_at, track_at))
    refused = refused | ~kept
    # The state moves on along the draft as if pick had drawn x (mirostat's mu sees its surprise);
    # rows past their first refusal move on too, and are set back below.
    drawn = Draw(x, jnp.ones(rows, bool), jnp.log(p_x))
    state = run.advance(sampler, state, drawn, _nonmask(now), vocab)
    return (state, accepted + (~refused).astype(jnp.int32), refused, p_at, track_at), None

  no = jnp.zeros(rows, bool)
  start = (state, jnp.zeros(rows, jnp.int32), no, jnp.zeros((rows, vocab), jnp.float32), track(state))
  (state_end, accepted, _, p_at, track_at), _ = lax.scan(step, start, jnp.arange(steps - 1))
  # The whole draft kept: the bonus token is pick's at the last row, with pick's state after it.
  bonus, picked = sampler.pick(_at(target_logits, steps - 1), state_end, last.pop("mask"), **last)

  # The first refusal, at a = accepted: the correction is drawn from norm(max(0, p_a - q_a)).
  window, position, stages = track_at
  state_at = state._replace(window=window, position=position, stages=stages)
  at = jnp.minimum(accepted, steps - 2)
  if draft_probs is None:
    q_at = jax.nn.one_hot(_gather(draft_tokens, at), vocab, dtype=jnp.float32)
  else:
    q_at = jnp.take_along_axis(jnp.asarray(draft_probs), at[:, None, None], axis=1)[:, 0].astype(jnp.float32)
  residual = jnp.maximum(p_at - q_at, 0.0)
  # Rounding can leave no residual mass (p = q to the last bit); p itself is then the answer.
  residual = jnp.where(jnp.sum(residual, axis=1, keepdims=True) > 0, residual, p_at)
  scores = jnp.where(residual > 0, jnp.log(jnp.where(residual > 0, residual, 1.0)), -jnp.inf)
  bits = jax.vmap(verifier_bits)(state_at.key, state_at.position)
  token, valid = jax.vmap(strategy.race_row)(scores, bits[:, 2:])
  logprob = jnp.where(valid, jnp.log(_gather(p_at, token)), 0.0)
  at_inputs = jax.tree.map(lambda a: jnp.take_along_axis(a, _index(at, a.ndim), axis=1)[:, 0], _nonmask(given))
  corrected = run.advance(sampler, state_at, Draw(token, valid, logprob), at_inputs, vocab)

  whole = accepted == steps - 1
  final = jnp.where(whole, bonus, token)
  window, position, stages = _choose(whole, track(picked), track(corrected))
  state = state._replace(window=window, position=position, stages=stages)
  j = jnp.arange(steps, dtype=jnp.int32)[None, :]
  drafted = jnp.pad(draft_tokens, ((0, 0), (0, 1)), constant_values=-1)
  tokens = jnp.where(j < accepted[:, None], drafted, jnp.where(j == accepted[:, None], final[:, None], -1))
  return tokens, accepted, state


def _index(at: jax.Array, ndim: int) -> jax.Array:
  """``at [B]`` shaped to index axis 1 of an array of ``ndim`` axes."""
  return at.reshape(at.shape + (1,) * (ndim - 1))


def _nonmask(inputs: dict) -> dict:
  """The per-call inputs that stages read (``run.advance`` takes them without the mask)."""
  return {name: jnp.asarray(value) for name, value in inputs.items() if name != "mask" and value is not None}
