"""Mirostat v1 and v2: truncation that steers the surprise of the drawn tokens towards ``tau`` bits.

Each row keeps a running ``mu`` (initially ``2 * tau``) in its stage state.
After every draw, ``mu -= eta * (surprise - tau)``, where the surprise is
``-log2 p`` of the drawn token under the distribution the draw used. Both
versions follow llama.cpp's ``llama_sampler_mirostat_apply`` and
``llama_sampler_mirostat_v2_apply`` (src/llama-sampling.cpp), float32 throughout.
"""

import math

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels import cut
from jsample._src.kernels.rowmath import logsumexp
from jsample._src.kernels.search import shortest_prefix
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, survivor_rank

M = 100
"""llama.cpp's ``m``: how many of the best tokens v1 fits its Zipf exponent to (common/sampling.cpp)."""

_LOG2E = 1.0 / math.log(2.0)


def _mu(s: Settings, ctx: Context) -> jax.Array:
  """This row's ``mu``; the state holds NaN until the first update, meaning ``2 * tau``."""
  mu = jnp.float32(jnp.nan) if ctx.state is None else ctx.state
  return jnp.where(jnp.isnan(mu), 2 * s["mirostat_tau"], mu)


def _zipf_k(best: jax.Array, alive: jax.Array, mu: jax.Array, vocab: int) -> jax.Array:
  """v1's ``k`` from the best ``M`` logits ``best [M]`` in sampling order (``-inf`` padded).

  llama.cpp: ``s_hat = Σ t_i b_i / Σ t_i²`` over the first ``M - 1`` pairs,
  ``t_i = log((i + 2) / (i + 1))``, ``b_i = log(p_i / p_{i+1})``; then
  ``k = (eps 2^mu / (1 - N^-eps))^(1 / s_hat)``, ``eps = s_hat - 1``, ``N`` the
  vocabulary size. ``b_i`` is taken as the logit difference (the exact log of
  the ratio); llama.cpp takes ``logf`` of the ratio of float probabilities,
  which is ``inf`` or NaN once a probability underflows to 0, and then its
  ``int(k)`` is undefined (x86 gives 1: greedy). ``alive`` is how many tokens
  survive (at least ``M`` will do). Returns ``floor(k)`` as float32, at least 1
  and possibly ``inf``.
  """
  i = jnp.arange(best.shape[0] - 1, dtype=jnp.float32)
  used = i < (jnp.minimum(M - 1, alive - 1)).astype(jnp.float32)
  t = jnp.log((i + 2) / (i + 1))
  b = jnp.where(used, best[:-1] - best[1:], 0.0)
  s_hat = jnp.sum(jnp.where(used, t * b, 0.0)) / jnp.sum(jnp.where(used, t * t, 0.0))
  eps = s_hat - 1
  n = jnp.float32(vocab)
  # eps == 0 is 0 / 0 in llama.cpp's formula; its limit is 2^mu / log N.
  ratio = jnp.where(eps == 0, jnp.power(2.0, mu) / jnp.log(n), eps * jnp.power(2.0, mu) / (1 - jnp.power(n, -eps)))
  k = jnp.power(ratio, 1 / s_hat)
  # llama.cpp's int(k) is undefined past INT_MAX (x86: INT_MIN, then max(., 1) = 1,
  # greedy); the formula means "keep all" there. NaN (fewer than 2 survivors) keeps 1.
  return jnp.maximum(jnp.where(jnp.isnan(k), 1.0, jnp.floor(k)), 1.0)


def _compact(logits: jax.Array, count: int) -> jax.Array:
  """The first ``count`` survivors of candidates ``[K]`` in sampling order, ``-inf`` padded."""
  slot = jnp.where(logits > -jnp.inf, survivor_rank(logits) - 1, count)
  return jnp.full(count, -jnp.inf, jnp.float32).at[slot].set(logits, mode="drop")


def mirostat(version: int = 0, tau: float = 5.0, eta: float = 0.1) -> Stage:
  """Mirostat: keeps the tokens whose surprise keeps the text near ``tau`` bits per token.

  - ``mirostat = 2``: keeps the tokens with surprise ``-log2 p <= mu`` (at least
    the best one), ``p`` the softmax of the current survivors.
  - ``mirostat = 1``: fits a Zipf exponent ``s`` to the best 100 tokens and
    keeps the ``k = (eps 2^mu / (1 - V^-eps))^(1 / s)`` best (``eps = s - 1``).
  - ``mirostat = 0``: off.

  After every draw ``mu -= eta * (-log2 p(token) - tau)``, with ``p`` the
  probability the draw used, so the stage must come **last** in the chain, as
  in llama.cpp. llama.cpp's mirostat replaces the chain: ``[logit_bias] +
  temp(temperature) + mirostat``, and its own draw replaces ``dist``. The
  jsample chain ``chain(temperature(t), mirostat(2))`` reproduces it (the draw
  follows the last stage anyway); a chain that serves rows with and without
  mirostat puts it after temperature and sets the other stages neutral on
  mirostat rows. :meth:`Sampler.accept` leaves ``mu`` alone: llama.cpp's
  mirostat has no accept hook, and a token it did not draw has no probability
  under its truncation.

  Arithmetic differences from llama.cpp: the surprise test is
  ``(log Z - logit) / ln 2 <= mu`` in float32 rather than ``-log2f`` of a float
  softmax, so a token within rounding of the threshold may fall on the other
  side; v1 fits ``s`` to logit differences (see :func:`_zipf_k`) and keeps every
  token where llama.cpp's ``int(k)`` overflows.

  Args:
    version: ``mirostat``, 0 (off), 1 or 2; a per-row setting.
    tau: ``mirostat_tau``, the target surprise in bits.
    eta: ``mirostat_eta``, the learning rate of ``mu``.

  Returns:
    A :class:`Stage` with per-row state ``mu`` (NaN until the first draw, read as ``2 * tau``).

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.temperature(1.0), jsample.mirostat(2, tau=1.0, eta=0.5))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> state = sampler.init(seed=0)
    >>> [round(float(p), 3) for p in sampler.probs(logits, state)]  # mu = 2 bits: p >= 1/4 survive
    [0.625, 0.375, 0.0, 0.0]
    >>> token, state = sampler.pick(logits, state)
    >>> int(token), round(float(state.stages["mirostat"]), 3)  # surprise log2(1 / 0.375): mu = 2 - 0.5 * (1.415 - 1)
    (1, 1.792)

  References:
    Basu et al., 2021, "Mirostat: A Neural Text Decoding Algorithm that
    Directly Controls Perplexity" (ICLR).
  """
  settings = (
    Setting(
      "mirostat",
      version,
      jnp.int32,
      lambda v: (v >= 0) & (v <= 2),
      "0 (off), 1 or 2",
      0,
      "mirostat version: 0 off, 1 (Zipf estimate of k) or 2 (surprise threshold)",
    ),
    Setting("mirostat_tau", tau, jnp.float32, jnp.isfinite, "finite", None, "mirostat's target surprise, in bits"),
    Setting("mirostat_eta", eta, jnp.float32, jnp.isfinite, "finite", None, "mirostat's learning rate for mu"),
  )

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    version = s["mirostat"]
    mu = _mu(s, ctx)
    (budget,) = c.ids.shape
    alive = c.logits > -jnp.inf
    rank = survivor_rank(c.logits)
    count = jnp.sum(alive)
    first = alive & (rank == 1)
    # v2: a threshold on the surprise under the row's distribution.
    log_z, known = c.log_normaliser()
    within = alive & ((log_z - c.logits) * _LOG2E <= mu)
    v2 = c.keep(within | first)
    v2_covers = c.covers_row | (alive[-1] & ~within[-1])  # tokens beyond rank below the last
    # v1: the k best, k from the best M survivors.
    best = _compact(c.logits, min(M, budget))
    fits = c.covers_row | ((budget >= M) & (count >= M))
    k = _zipf_k(best, jnp.where(c.covers_row, count, M), mu, ctx.vocab)
    v1 = c.keep(alive & (rank.astype(jnp.float32) <= k))
    v1_covers = c.covers_row | (k <= count.astype(jnp.float32))
    off = version == 0
    one = version == 1
    kept = jnp.where(one, v1.logits, v2.logits)
    covers = jnp.where(one, v1_covers, v2_covers)
    decided = jnp.where(one, fits, known)
    return c._replace(
      logits=jnp.where(off, c.logits, kept),
      log_z_known=c.log_z_known & off,
      covers_row=jnp.where(off, c.covers_row, covers),
      decided=c.decided & (off | (decided & covers)),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    version = s["mirostat"]
    mu = _mu(s, ctx)

    def v1():
      alive = logits > -jnp.inf
      best, _ = cut.top_candidates(logits[None], None, min(M, logits.shape[0]), branch_free=ctx.branch_free)
      count = jnp.sum(alive)
      k = jnp.minimum(_zipf_k(best[0], count, mu, ctx.vocab), count.astype(jnp.float32))
      keep = shortest_prefix(logits, alive.astype(jnp.int32), k.astype(jnp.int32))
      return jnp.where(keep, logits, -jnp.inf)

    def v2():
      alive = logits > -jnp.inf
      first = jnp.arange(logits.shape[0]) == jnp.argmax(logits)  # ties to the lower id
      within = alive & ((logsumexp(logits) - logits) * _LOG2E <= mu)
      return jnp.where(within | (first & alive), logits, -jnp.inf)

    return lax.switch(jnp.clip(version, 0, 2), (lambda: logits, v1, v2))

  def update(mu, token, logprob, s: Settings, ctx: Context):
    # A token drawn by mirostat moves mu; accept (NaN logprob) and empty rows do not.
    moves = (s["mirostat"] > 0) & (token >= 0) & ~jnp.isnan(logprob)
    surprise = -logprob * _LOG2E
    return jnp.where(moves, _mu(s, ctx) - s["mirostat_eta"] * (surprise - s["mirostat_tau"]), mu)

  return Stage(
    "mirostat",
    settings,
    on_candidates,
    on_row,
    init_state=lambda: jnp.float32(jnp.nan),
    update=update,
    argmax_invariant=lambda s: jnp.bool_(True),  # v1 keeps k >= 1 best, v2 the best always
    is_neutral=lambda s: s["mirostat"] == 0,
  )
