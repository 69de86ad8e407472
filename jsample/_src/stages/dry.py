"""DRY ("don't repeat yourself"): penalise tokens that would extend a repeat of the recent window.

llama.cpp's ``llama_sampler_dry_apply`` (src/llama-sampling.cpp), on the window's last ``dry_penalty_last_n``
tokens. With ``rat(i)`` the ``i``-th most recent token and ``N`` tokens in view:

1. ``rep_limit``: at the most recent ``i`` where a sequence breaker ends (its head at ``rat(i)``, its tail after
   it; the longest such breaker), the number of tokens after the breaker; ``N`` when there is none.
2. ``n_k`` for ``k = 1 .. N - 1``: the length of the common suffix of the window and the window without its last
   ``k`` tokens, capped at ``rep_limit`` (llama.cpp's reversed Z-algorithm).
3. The token ``rat(k - 1)`` that followed each such earlier occurrence, where ``n_k >= allowed``, would extend a
   repeat of ``n_k`` tokens; it loses ``multiplier * base^(max n_k - allowed)`` (the exponent capped where the
   power would pass the largest float), unless it is a single-token breaker.
"""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import lookup
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, always_valid

_FLOAT_MAX_LOG = 88.7228391  # llama.cpp's log(FLT_MAX)


def _gapless(v):
  """Breaker rows: ids ``>= 0`` then ``-1`` padding, nothing after the first ``-1``."""
  v = jnp.asarray(v)
  after_gap = (v[..., :-1] < 0) & (v[..., 1:] >= 0)
  ok = jnp.concatenate([jnp.ones(v.shape[:-1] + (1,), bool), ~after_gap], axis=-1)
  return (v >= -1) & ok


def _settings(multiplier, base, allowed_length, last_n, breakers):
  return (
    Setting(
      "dry_multiplier",
      multiplier,
      jnp.float32,
      lambda v: jnp.isfinite(v) & (v >= 0),
      "finite and >= 0 (0: off)",
      0.0,
      "DRY: the penalty of a token that extends a repeat of allowed_length tokens (0: off)",
    ),
    Setting(
      "dry_base",
      base,
      jnp.float32,
      jnp.isfinite,
      "finite (< 1: off)",
      None,
      "DRY: each token of repeat beyond allowed_length multiplies the penalty by it",
    ),
    Setting(
      "dry_allowed_length",
      allowed_length,
      jnp.int32,
      always_valid,
      "any integer",
      None,
      "DRY: repeats of up to this many tokens are free",
    ),
    Setting(
      "dry_penalty_last_n",
      last_n,
      jnp.int32,
      lambda v: v >= -1,
      ">= -1 (-1: the whole window)",
      0,
      "DRY: how many recent tokens to scan for repeats (0: off, -1: the whole window)",
      at_most="window_size",
    ),
    Setting(
      "dry_sequence_breakers",
      breakers,
      jnp.int32,
      _gapless,
      "token ids >= 0 then -1 padding, per row",
      None,
      "DRY: token-id sequences that end a repeat, one per row of [N, L], -1 padded",
      shape=breakers.shape,
    ),
  )


class _Repeats:
  """One row's DRY analysis: what would extend a repeat, and by how much."""

  def __init__(self, s: Settings, ctx: Context):
    (width,) = ctx.window.shape
    allowed = s["dry_allowed_length"]
    last_n = s["dry_penalty_last_n"]
    last_n = jnp.where(last_n < 0, width, jnp.minimum(last_n, width))
    n = jnp.minimum(last_n, ctx.position)
    age = jnp.arange(width, dtype=jnp.int32)
    token = jnp.take(ctx.window, ctx.ages(), mode="clip")  # the token of each age
    # x[a] = rat(a); ages beyond view and empty slots get distinct negative ids, matching nothing.
    x = jnp.where((age < n) & (token >= 0), token, -2 - age)
    limit = _rep_limit(x, n, s["dry_sequence_breakers"])
    z = _z_loop(x) if not ctx.branch_free else _z_vectorised(x)
    length = jnp.minimum(z, limit)
    # k = age + 1: the token rat(k - 1) follows an earlier copy of the last n_k tokens.
    k = age + 1
    length = jnp.concatenate([length[1:], jnp.zeros(1, jnp.int32)])  # n_k at index k - 1
    self.follows = jnp.where(k < n, x, -1)  # rat(k - 1)
    self.extends = (k < n) & (length >= allowed) & (x >= 0)
    self.length = length
    single = s["dry_sequence_breakers"]
    self.single = jnp.where(
      (single[:, 0] >= 0) & ((single[:, 1] < 0) if single.shape[1] > 1 else True), single[:, 0], -1
    )
    base = s["dry_base"]
    on = (s["dry_multiplier"] != 0) & (base >= 1) & (last_n != 0)
    self.active = on & (n > allowed) & (limit >= allowed) & jnp.any(self.extends)
    self.s = s
    self.width = width
    self.unrolled = ctx.branch_free

  def penalty(self, longest: jax.Array) -> jax.Array:
    """llama.cpp's ``float(mult * pow(base, e))``, ``pow`` and product in double, for repeat lengths ``longest``."""
    base = self.s["dry_base"]
    e = longest - self.s["dry_allowed_length"]
    top = jnp.where(base > 1.000001, jnp.floor(jnp.float32(_FLOAT_MAX_LOG) / jnp.log(base)), 0).astype(jnp.int32)
    e = jnp.where((top > 0) & (e > top), top, e)
    # A repeat fits in the window, so e <= W: W's bits are all the power needs (a smaller program to compile).
    bits = max(1, self.width.bit_length())
    return _scaled_power(self.s["dry_multiplier"], base, jnp.maximum(e, 0), bits=bits, unrolled=self.unrolled)


def _rep_limit(x: jax.Array, n: jax.Array, breakers: jax.Array) -> jax.Array:
  """Tokens after the most recent complete breaker (its longest match), or ``n``."""
  (width,) = x.shape
  count, length = breakers.shape
  match = jnp.broadcast_to(breakers[:, 0] >= 0, (width, count))
  for c in range(length):  # the breaker's c-th token sits c places more recent than its head
    shifted = jnp.concatenate([jnp.full(c, -1, jnp.int32), x[: width - c]]) if c else x
    match = match & ((breakers[None, :, c] < 0) | (shifted[:, None] == breakers[None, :, c]))
  tail = jnp.sum(breakers >= 0, axis=1) - 1
  age = jnp.arange(width, dtype=jnp.int32)
  match = match & (age[:, None] < n) & (tail[None, :] <= age[:, None])
  longest = jnp.max(jnp.where(match, tail[None, :], -1), axis=1)
  first = jnp.argmax(longest >= 0)
  return jnp.where(jnp.any(longest >= 0), first - longest[first], n)


def _z_vectorised(x: jax.Array) -> jax.Array:
  """``z[k]`` = length of the common prefix of ``x`` and ``x[k:]``: every pair compared ([W, W])."""
  (width,) = x.shape
  padded = jnp.concatenate([x, -2 - width - jnp.arange(width, dtype=jnp.int32)])
  shift = jnp.arange(width)[:, None] + jnp.arange(width)[None, :]
  same = x[None, :] == padded[shift]
  return jnp.where(jnp.all(same, axis=1), width, jnp.argmin(same, axis=1)).astype(jnp.int32)


_CHUNK = 8  # pairs one step of the Z loop compares at once


def _z_rows(x: jax.Array) -> jax.Array:
  """The Z array of each row of ``x`` ``[B, W]``, as one loop that ends when every row is done.

  The Z-algorithm, with two shortcuts that keep its result: a position whose
  token differs from ``x[0]`` has ``z = 0`` and is never visited, and a match is
  extended ``_CHUNK`` pairs per step. A row's steps are its positions holding
  ``x[0]`` plus its extensions, at most ``W + W / _CHUNK``; text that rarely
  repeats its last token needs a few dozen. The rows step together, each
  masked by its own ``live`` flag, so the loop carries no per-row select.
  """
  batch, width = x.shape
  if width < 2:
    return jnp.zeros((batch, width), jnp.int32)
  rows = jnp.arange(batch)
  index = jnp.arange(width, dtype=jnp.int32)
  # The next position at or after each k that holds x[0] (width: none), so a step jumps straight to it.
  ahead = lax.cummin(jnp.where(x == x[:, :1], index, width), axis=1, reverse=True)
  ahead = jnp.concatenate([ahead, jnp.full((batch, 1), width, jnp.int32)], axis=1)
  # Past the row, distinct ids no token has: a comparison that reaches them fails.
  padded = jnp.concatenate([x, jnp.broadcast_to(-width - 2 - jnp.arange(_CHUNK, dtype=jnp.int32), (batch, _CHUNK))], 1)
  offsets = jnp.arange(_CHUNK, dtype=jnp.int32)[None, :]

  def step(carry):
    k, zk, left, right, z = carry
    live = k < width
    head = jnp.take_along_axis(padded, jnp.minimum(zk[:, None] + offsets, width + _CHUNK - 1), axis=1)
    tail = jnp.take_along_axis(padded, jnp.minimum((k + zk)[:, None] + offsets, width + _CHUNK - 1), axis=1)
    same = head == tail
    extend = live & jnp.all(same, axis=1)
    close = live & ~extend
    length = zk + jnp.argmin(same, axis=1).astype(jnp.int32)
    z = z.at[rows, jnp.where(close, k, width)].set(length, mode="drop")
    grow = close & (k + length > right)
    left, right = jnp.where(grow, k, left), jnp.where(grow, k + length, right)
    nxt = ahead[rows, jnp.minimum(k + 1, width)]
    # Inside the rightmost match, z starts from its mirror's value.
    mirror = z[rows, jnp.clip(nxt - left, 0, width - 1)]
    start = jnp.where(nxt < right, jnp.minimum(right - nxt, mirror), 0)
    zk = jnp.where(extend, zk + _CHUNK, jnp.where(close, start, zk))
    return jnp.where(close, nxt, k), zk, left, right, z

  zero = jnp.zeros(batch, jnp.int32)
  carry = (ahead[:, 1], zero, zero, zero, jnp.zeros((batch, width), jnp.int32))
  return lax.while_loop(lambda c: jnp.any(c[0] < width), step, carry)[4]


@jax.custom_batching.custom_vmap
def _z_loop(x: jax.Array) -> jax.Array:
  """``z[k]`` = length of the common prefix of ``x`` and ``x[k:]`` (``z[0] = 0``), by :func:`_z_rows`.

  Under ``vmap`` the rows go to one loop together (its own batching rule):
  ``vmap`` of a ``while_loop`` would select every row's whole carry at every step.
  """
  return _z_rows(x[None])[0]


@_z_loop.def_vmap
def _z_loop_rows(axis_size: int, in_batched: list[bool], x: jax.Array):
  (batched,) = in_batched
  return (_z_rows(x), True) if batched else (_z_loop(x), False)


def _two_sum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``a + b`` as ``s + err`` exactly (Knuth's sum: additions only, whatever the magnitudes)."""
  s = a + b
  v = s - a
  return s, (a - (s - v)) + (b - v)


def _two_product(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``a * b`` as a float32 pair ``p + err``, to about 2^-47 of the product.

  Both factors are cut into 12-bit halves by masking bits, so each of the four partial products is exact and
  the pair is built from them by exact sums. No rounded product is ever subtracted: a compiler that contracts
  ``x * y + z`` into an FMA (XLA's LLVM backends do, inside a loop body on CPU) cannot change a bit, where
  Dekker's ``a * b - p`` lost the whole error term.
  """

  def split(v):  # the top 12 bits of the significand, and the exact rest
    hi = lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32)
    return hi, v - hi

  (ah, al), (bh, bl) = split(a), split(b)
  s, e1 = _two_sum(ah * bh, ah * bl)
  s, e2 = _two_sum(s, al * bh)
  err = (e1 + e2) + al * bl
  p = s + err
  err = err - (p - s)
  # Near overflow the sums lose their meaning; there the penalty removes the token whatever its last bits.
  return p, jnp.where(jnp.abs(p) < 2.0**100, err, 0.0)


def _times(a_hi: jax.Array, a_lo: jax.Array, b_hi: jax.Array, b_lo: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The product of two double-floats ``hi + lo``, as a double-float."""
  p, err = _two_product(a_hi, b_hi)
  err = err + (a_hi * b_lo + a_lo * b_hi)
  s = p + err
  return s, err - (s - p)


def _scaled_power(mult: jax.Array, base: jax.Array, e: jax.Array, bits: int = 31, unrolled: bool = False) -> jax.Array:
  """``float(double(mult) * pow(double(base), e))`` for integers ``0 <= e < 2^bits``, in float32 pairs.

  Squaring in double-float (about 47 bits) then rounding once to float32 gives
  llama.cpp's double result bar a tie within about ``2^bits * 2^-47`` of a rounding boundary.
  ``base`` and ``mult`` may be a row's scalars beside a ``[K]`` of ``e``: the
  squares are then computed once for the row, not once per candidate.

  One loop over ``e``'s bits (``lax.fori_loop``): rolled, it spares the CPU program the two double-float products
  per bit written out (``llama_cpp()``'s: 21,570 -> 19,975 HLO instructions). ``unrolled`` writes it out, for the
  accelerator strategy, whose program holds no loop outside its rare path.
  """
  shape = jnp.broadcast_shapes(jnp.shape(base), jnp.shape(e))

  def multiply(bit, carry):  # by base^(2^bit) where e has that bit, then square it for the next bit
    hi, lo, sq_hi, sq_lo = carry
    use = ((e >> bit) & 1) == 1
    new_hi, new_lo = _times(hi, lo, sq_hi, sq_lo)
    # Squares past e's top bit may overflow, and go unused.
    return jnp.where(use, new_hi, hi), jnp.where(use, new_lo, lo), *_times(sq_hi, sq_lo, sq_hi, sq_lo)

  one = (jnp.ones(shape, jnp.float32), jnp.zeros(shape, jnp.float32))
  carry = (*one, base, jnp.zeros_like(base))
  if unrolled:
    for bit in range(bits):
      carry = multiply(bit, carry)
  else:
    carry = lax.fori_loop(0, bits, multiply, carry)
  hi, lo, _, _ = carry
  p, err = _two_product(mult, hi)
  return p + (err + mult * lo)


def _apply(logits: jax.Array, longest: jax.Array, penalised: jax.Array, r: _Repeats) -> jax.Array:
  out = jnp.where(penalised, logits - r.penalty(longest), logits)
  # +inf - inf counts as removed; a removed token stays removed.
  out = jnp.where(jnp.isnan(out), -jnp.inf, out)
  return jnp.where(logits > -jnp.inf, out, -jnp.inf)


def dry(
  multiplier: float = 0.0,
  base: float = 1.75,
  allowed_length: int = 2,
  penalty_last_n: int = -1,
  sequence_breakers=None,
  *,
  max_breakers: int = 8,
  max_breaker_length: int = 4,
) -> Stage:
  """DRY: penalises tokens that would extend a repeat of the recent window.

  A token that would extend a repeat of ``L >= allowed_length`` tokens of the
  window loses ``multiplier * base^(L - allowed_length)`` (llama.cpp's
  arithmetic: ``L`` does not count the new token, the power and product in
  double, rounded to float32 once). Sequence breakers (token-id sequences such
  as a newline) end a repeat: no repeat reaches back past the most recent one,
  and a token that is a whole breaker by itself is never penalised.
  llama.cpp turns breaker *strings* into token sequences with the vocabulary;
  here they are token ids already (``[N, L]`` per row, ``-1`` padded).

  The stage only lowers logits, and only of the window's tokens, so it acts
  before the cut, and the CPU strategy's cut leaves those tokens out
  (:attr:`Stage.lowers`).
  The window includes the prompt once :meth:`Sampler.load_prompt` has loaded
  it; ``penalty_last_n = -1`` means the whole window (llama.cpp: the context).

  Args:
    multiplier: ``dry_multiplier``, ``>= 0``; 0 is off.
    base: ``dry_base``; below 1 is off.
    allowed_length: ``dry_allowed_length``, repeats this long cost ``multiplier``.
    penalty_last_n: ``dry_penalty_last_n``, how many recent tokens count (0:
      off, -1: the whole window).
    sequence_breakers: ``dry_sequence_breakers``, token-id sequences (a list
      of lists), padded to ``[max_breakers, max_breaker_length]`` with ``-1``.
    max_breakers: ``N``, how many breakers a row can hold (static).
    max_breaker_length: ``L``, their longest length in tokens (static).

  Returns:
    A :class:`Stage` that acts before the cut to ``K`` candidates.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.dry(0.8, 1.75, 2), jsample.temperature(1.0), window_size=16)
    >>> state = sampler.init(seed=0, prompt=[1, 2, 3, 4, 9, 1, 2, 3])  # "1 2 3" repeats: 4 would extend it
    >>> p = sampler.probs(jnp.zeros(10), state)
    >>> round(float(p[4] / p[0]), 3)  # a repeat of 3 tokens: exp(-0.8 * 1.75)
    0.247

  References:
    p-e-w, 2024, "DRY: A modern repetition penalty that reliably prevents
    looping", text-generation-webui pull request 5677; llama.cpp pull request
    9702 (the port this follows).
  """
  given = [] if sequence_breakers is None else [list(b) for b in sequence_breakers]
  count = max(max_breakers, len(given), 1)
  length = max(max_breaker_length, max((len(b) for b in given), default=0), 1)
  table = jnp.full((count, length), -1, jnp.int32)
  for i, b in enumerate(given):
    table = table.at[i, : len(b)].set(jnp.asarray(b, jnp.int32))

  def touches(s: Settings, ctx: Context) -> jax.Array:
    (width,) = ctx.window.shape
    last_n = s["dry_penalty_last_n"]
    last_n = jnp.where(last_n < 0, width, jnp.minimum(last_n, width))
    age = ctx.ages()
    on = (s["dry_multiplier"] != 0) & (s["dry_base"] >= 1) & (last_n != 0)
    # rat(k - 1) for k < N: every token in view but the oldest; none where DRY is off.
    return jnp.where(on & (age < jnp.minimum(last_n, ctx.position) - 1), ctx.window, -1)

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    if not ctx.window.shape[0]:
      return c
    r = _Repeats(s, ctx)
    # Look the window's tokens up among the candidates (sorted once), not every pair:
    # [K, W] comparisons fused with a reduction cost far more on a CPU.
    (width,) = c.ids.shape
    found = lookup.index(c.ids, ctx.vocab)

    def slots(tokens, use):
      return lookup.find(found, tokens, use, branch_free=ctx.branch_free)

    slot, hit = slots(r.follows, r.extends)
    longest = jnp.full(width, -1, jnp.int32).at[jnp.where(hit, slot, width)].max(r.length, mode="drop")
    head, is_head = slots(r.single, r.single >= 0)
    single = jnp.zeros(width, bool).at[jnp.where(is_head, head, width)].set(True, mode="drop")
    penalised = r.active & (longest >= 0) & ~single
    return c._replace(logits=_apply(c.logits, longest, penalised, r), log_z_known=c.log_z_known & ~r.active)

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    if not ctx.window.shape[0]:
      return logits
    r = _Repeats(s, ctx)

    def penalise():
      (width,) = logits.shape
      slot = jnp.where(r.extends, r.follows - ctx.offset, width)
      slot = jnp.where((slot >= 0) & (slot < width), slot, width)
      longest = jnp.full(width, -1, jnp.int32).at[slot].max(r.length, mode="drop")
      heads = jnp.where((r.single >= ctx.offset) & (r.single < ctx.offset + width), r.single - ctx.offset, width)
      single = jnp.zeros(width, bool).at[heads].set(True, mode="drop")
      return _apply(logits, longest, (longest >= 0) & ~single, r)

    return lax.cond(r.active, penalise, lambda: logits)  # no pass over V where off

  settings = _settings(multiplier, base, allowed_length, penalty_last_n, table)

  def lowers(s: Settings, ctx: Context) -> jax.Array:
    return s["dry_multiplier"] >= 0  # a negative one (traced past init's check) would raise

  def is_neutral(s: Settings) -> jax.Array:
    return ~((s["dry_multiplier"] != 0) & (s["dry_base"] >= 1) & (s["dry_penalty_last_n"] != 0))

  return Stage("dry", settings, on_candidates, on_row, touches=touches, lowers=lowers, is_neutral=is_neutral)
