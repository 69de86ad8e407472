"""Branch-free building blocks over a whole batch ``[B, V]``, for accelerators.

On XLA:GPU every ``lax.cond`` or ``while_loop`` predicate goes to the host, which
then waits for the device, and a ``lax.map`` over rows pays that once per row
(``ACCELERATORS.md``). The functions here take the whole batch at once and run a
fixed number of fused passes over it: Python loops unroll at trace time, and a
per-row choice is a select, never a branch. Each stands in for a per-row
function:

- :func:`shortest_prefix`: ``jax.vmap(search.shortest_prefix)``, bit for bit;
- :func:`race`: ``jax.vmap(noise.race_row)``, bit for bit;
- :func:`greedy`: the token of the greedy chain ``chain(temperature(0.0))``;
- :func:`log_normalisers`: ``cut.log_normalisers``.

Maxima, argmaxima and integer sums are exact in any order. Float sums are not:
they agree bit for bit only when XLA adds the same numbers in the same order.
So wherever a per-row function sums floats, the batched one sums the same
elementwise expression over the last axis of ``[B, V]``, which is what ``vmap``
makes of the per-row sum. XLA chooses the order per reduction shape and fusion:
on XLA:CPU a ``[V]`` row summed inside ``lax.map`` can round differently from the
same row summed in a ``[B, V]`` batch (see ``tests/test_batched.py``), and
nothing has yet been checked on a GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsample._src.kernels import cut, noise, search

_ID_SENTINEL = np.iinfo(np.int32).max


def _digits(total: int, bits: int) -> list[tuple[int, int]]:
  """``(shift, width)`` of each digit of a ``total``-bit number, most significant first.

  The top digit takes the remainder, so every other one is ``bits`` wide.
  """
  first = total % bits or bits
  widths = [first] + [bits] * ((total - first) // bits)
  return [(total - sum(widths[: i + 1]), w) for i, w in enumerate(widths)]


def _largest(base: jax.Array, trials: list[jax.Array], reached: list[jax.Array]) -> jax.Array:
  """The largest trial that reached, else ``base``; all ``[B]``.

  Taken as a reduction over ``[B, n]``, built with selects (XLA folds a reduction
  over a stack, or a chain of maxima, back into elementwise ops). Elementwise ops
  fuse into every consumer, so each later pass would recompute all earlier passes'
  choices for each of its ``B * V`` elements, and compile for minutes; a reduction's
  result is computed once, and later passes read it.
  """
  spot = lax.broadcasted_iota(jnp.int32, (base.shape[0], len(trials) + 1), 1)
  picks = jnp.broadcast_to(base[:, None], spot.shape)
  for j, (t, r) in enumerate(zip(trials, reached, strict=True)):
    picks = jnp.where((spot == j + 1) & r[:, None], t[:, None], picks)
  return jnp.max(picks, axis=-1)


def shortest_prefix(logits: jax.Array, weight: jax.Array, target: jax.Array, *, bits: int = 4) -> jax.Array:
  """The shortest prefix of each row, in sampling order, whose weight reaches ``target``.

  The same result as ``jax.vmap(search.shortest_prefix)(logits, weight, target)``,
  ties and rounding included, without loops: a radix search over the order key,
  ``bits`` bits per pass (``2**bits - 1`` sibling sums, one fused pass over the
  batch on GPU), then the same over the ids of the tokens tied at the crossing.

  Why it is exact: the per-row search sets one bit at a time and keeps it when
  ``sum(where(key >= bound, weight, 0)) >= target``. For non-negative weights and
  one reduction order that sum can only shrink as ``bound`` grows (rounding is
  monotone), so the bit search finds the largest bound that passes, and so does
  any search that asks the same question with the same sum, ``bits`` at a time.
  The same holds for the id search (its sums only grow with the id).

  Args:
    logits: ``[B, V]`` float32.
    weight: ``[B, V]`` non-negative weights: int32 counts or float32 masses.
    target: ``[B]`` the weight each row's prefix must reach.
    bits: bits decided per pass (static): ``ceil(32 / bits)`` passes of ``2**bits - 1``
      sums for the key, one for the weight above it, then for float weights
      ``ceil(log2(V + 1) / bits)`` more for the id (integer weights: one running sum).

  Returns:
    ``[B, V]`` bool, True for members of the prefix.
  """
  batch, vocab = logits.shape
  key = search.order_key(logits)
  zero = jnp.zeros((), weight.dtype)
  smallest = 1 if jnp.issubdtype(weight.dtype, jnp.integer) else jnp.finfo(weight.dtype).tiny
  target = jnp.maximum(target, jnp.asarray(smallest, weight.dtype))

  def weight_from(bound):  # search.shortest_prefix's reduction, per row
    return jnp.sum(jnp.where(key >= bound[:, None], weight, zero), axis=-1)

  crossing = jnp.zeros((batch,), jnp.uint32)
  for shift, width in _digits(32, bits):
    trials = [crossing | jnp.uint32(j << shift) for j in range(1, 2**width)]
    crossing = _largest(crossing, trials, [weight_from(t) >= target for t in trials])

  above = jnp.sum(jnp.where(key > crossing[:, None], weight, zero), axis=-1)
  tied = key == crossing[:, None]
  ids = lax.broadcasted_iota(jnp.int32, (batch, vocab), 1)
  need = target - above

  def short(trial):  # the tied tokens below `trial` weigh less than `need`
    return jnp.sum(jnp.where(tied & (ids < trial[:, None]), weight, zero), axis=-1) < need

  if jnp.issubdtype(weight.dtype, jnp.integer):
    # Integer sums are exact in any order, so one running sum answers every
    # trial at once: the tied weight below id t + 1 is running[t], and the
    # trials that pass are t = 0 .. (how many running sums stay short).
    running = jnp.cumsum(jnp.where(tied, weight, zero), axis=-1)
    last = jnp.sum(running < need[:, None], axis=-1, dtype=jnp.int32)
  else:
    last = jnp.zeros((batch,), jnp.int32)
    for shift, width in _digits(max(1, vocab.bit_length()), bits):
      trials = [last | (j << shift) for j in range(1, 2**width)]
      last = _largest(last, trials, [(t <= vocab) & short(t) for t in trials])
  return (key > crossing[:, None]) | (tied & (ids <= last[:, None]))


def _argmax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(max, first index of the max)`` of each row ``[B, V]`` in one variadic pass; needs no NaN."""

  def better(a, b):
    take = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
    return jnp.where(take, b[0], a[0]), jnp.where(take, b[1], a[1])

  ids = lax.broadcasted_iota(jnp.int32, x.shape, 1)
  init = (jnp.array(-jnp.inf, x.dtype), jnp.array(_ID_SENTINEL, jnp.int32))
  return lax.reduce((x, ids), init, better, (1,))


def _noise(step_bits: jax.Array, vocab: int) -> jax.Array:
  """``noise.gumbel`` of ids ``0..vocab-1`` for each row's step bits ``[B, 2]``: ``[B, vocab]`` float32.

  ``noise.gumbel`` rebuilds its group's top noise for every id; here each group's
  hash, logs and ``exp(-top)`` are computed once and broadcast over its ids (the
  same operations on the same numbers, so the same values).
  """
  batch = step_bits.shape[0]
  groups = vocab // noise.GROUP
  out = []
  if groups:
    top, leader = jax.vmap(noise._group, in_axes=(0, None))(step_bits, jnp.arange(groups, dtype=jnp.int32))
    fade = jnp.exp(-top)
    ids = jnp.arange(groups * noise.GROUP, dtype=jnp.int32).reshape(groups, noise.GROUP)
    member = jax.vmap(lambda w: noise._exponential(*noise._bits(w ^ noise._TOKEN_SALT, ids)))(step_bits)
    rest = -jnp.log(fade[:, :, None] + member)
    spot = (ids % noise.GROUP)[None]
    out.append(jnp.where(spot == leader[:, :, None], top[:, :, None], rest).reshape(batch, groups * noise.GROUP))
  if vocab > groups * noise.GROUP:  # the ragged last group, as noise.gumbel builds it
    tail = jnp.arange(groups * noise.GROUP, vocab, dtype=jnp.int32)
    out.append(jax.vmap(noise.gumbel, in_axes=(0, None))(step_bits, tail))
  return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)


def race(logits: jax.Array, step_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Draws one survivor per row: ``jax.vmap(noise.race_row)(logits, step_bits)``, without a branch.

  ``argmax(logits + gumbel)`` over every id, ties to the lower id: the noise, the
  score and a variadic argmax (best score and its id together, no second pass).
  ``race_row`` reads only the groups whose bound can win, but falls back to the
  whole row when too many can, and that choice is a branch: as a select, the
  fallback would run every time. So every id is scored here; each group's top
  noise is built once, not once per id as ``noise.gumbel`` does.

  Args:
    logits: ``[B, V]`` float32, ``-inf`` (or NaN) for removed tokens.
    step_bits: ``[B, 2]`` uint32 step bits (:func:`noise.step_bits`).

  Returns:
    ``(token [B] int32, valid [B] bool)``: the winner (0 where nothing survives).
  """
  alive = logits > -jnp.inf
  score = jnp.where(alive, logits + _noise(step_bits, logits.shape[1]), -jnp.inf)
  _, token = _argmax(score)
  valid = jnp.any(alive, axis=-1)
  return jnp.where(valid, token, 0), valid


def race_plain(logits: jax.Array, step_bits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """:func:`race` through ``jax.vmap(noise.race)`` over every id: each id rebuilds its group's noise.

  Kept to measure against :func:`race`; the tokens are the same.
  """
  ids = jnp.arange(logits.shape[1], dtype=jnp.int32)
  return jax.vmap(noise.race, in_axes=(0, None, 0))(logits, ids, step_bits)


def allowed(mask: jax.Array | None, vocab: int) -> jax.Array | None:
  """A batch's mask, bool ``[B, V]`` or packed ``[B, ceil(V/32)]``, as bool ``[B, V]`` (None stays None).

  The packed words unpack by broadcasting, not by a gather.
  """
  if mask is None or mask.dtype == jnp.bool_:
    return mask
  # masks.unpack, with the batch size spelled out (a reshape to -1 fails on no rows).
  words = lax.bitcast_convert_type(mask, jnp.uint32)
  bits = (words[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)[None, None, :]) & jnp.uint32(1)
  return bits.reshape(mask.shape[0], mask.shape[1] * 32)[:, :vocab] == 1


def clean(raw: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """:func:`cut.clean` of a batch ``[B, V]``: float32, NaN and disallowed as ``-inf``, ``+inf`` as the largest
  float, ``-0`` as ``+0``. Meant to be fused into its reader, never stored."""
  x = cut.clean(raw)
  ok = allowed(mask, raw.shape[-1])
  return x if ok is None else jnp.where(ok, x, -jnp.inf)


def greedy(raw: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The greedy token of each row: the cleaned argmax, ties to the lower id, in one pass.

  What ``chain(temperature(0.0))`` picks: NaN counts as ``-inf``, ``+inf`` as the
  largest float, ``-0`` equals ``+0``, disallowed tokens are removed.

  Args:
    raw: ``[B, V]`` logits, any float dtype.
    mask: None, bool ``[B, V]`` or packed int32 ``[B, ceil(V/32)]``.

  Returns:
    ``(token [B] int32, valid [B] bool)``; token 0 where nothing survives.
  """
  best, token = _argmax(clean(raw, mask))
  valid = best > -jnp.inf
  return jnp.where(valid, token, 0), valid


def log_normalisers(raw: jax.Array, mask: jax.Array | None, top: jax.Array | None = None) -> jax.Array:
  """``log Σ exp`` of each cleaned row, as ``cut.log_normalisers``, in one pass with the cleaning fused.

  Bit for bit what ``jax.vmap`` of the per-row ``logsumexp(cut.clean_row(...))``
  gives, as ``cut.log_normalisers(..., branch_free=True)`` does. Without
  ``branch_free`` it takes that per-row way under ``lax.map`` when a row is dirty
  or masked, where XLA:CPU may round the sum differently: there the two agree
  within rounding.

  Args:
    raw: ``[B, V]`` logits, any float dtype.
    mask: None, bool ``[B, V]`` or packed int32 ``[B, ceil(V/32)]``.
    top: ``[B]`` each cleaned row's maximum, or None to take it here (one more pass).

  Returns:
    ``[B]`` float32; ``-inf`` for a row where nothing survives.
  """
  x = clean(raw, mask)
  if top is None:
    top = jnp.max(x, axis=-1)
  # rowmath.logsumexp, batched: the same shift, exp and sum per row.
  shift = jnp.where(top > -jnp.inf, top, 0.0)
  return shift + jnp.log(jnp.sum(jnp.exp(x - shift[:, None]), axis=-1))
