"""Temperature, dynamic temperature (llama.cpp's temp_ext), and greedy decoding at temperature zero."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels.rowmath import entropy, logsumexp
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage


def _scale(logits: jax.Array, best: jax.Array, t: jax.Array) -> jax.Array:
  # Shifting by the best logit first keeps (logit - best) / t finite for tiny t.
  shifted = jnp.where(best > -jnp.inf, logits - best, logits)
  # Removed tokens stay -inf: a traced t = +inf would make them -inf / inf = NaN.
  return jnp.where(logits > -jnp.inf, shifted / jnp.where(t > 0, t, 1.0), -jnp.inf)


def _dynamic(logits: jax.Array, s: Settings) -> jax.Array:
  """The row's temperature under temp_ext: from ``t - range`` to ``t + range`` as the
  normalised entropy ``H / log N`` (``N`` survivors) goes from 0 to 1, raised to ``exponent``."""
  t, spread = s["temperature"], s["dynatemp_range"]
  low, high = jnp.maximum(t - spread, 0.0), t + spread
  count = jnp.sum(logits > -jnp.inf).astype(jnp.float32)
  h = entropy(logits, logsumexp(logits)) / jnp.log(jnp.maximum(count, 2.0))
  # With one survivor llama.cpp leaves the logits alone; any temperature draws it.
  return jnp.where(count > 1, low + (high - low) * jnp.power(h, s["dynatemp_exponent"]), t)


def temperature(
  t: float = 0.8, dynatemp_range: float = 0.0, dynatemp_exponent: float = 1.0, *, dynamic: bool = True
) -> Stage:
  """Divides the surviving logits by ``t`` (``<= 0``: greedy), or by a ``t`` that follows the row's entropy.

  Greedy keeps only the best survivor, ties to the lower id: with the
  llama.cpp order, that is the highest logit after mask and penalties.
  The logits are shifted by their maximum first, which changes no probability
  and keeps tiny temperatures finite. Its row statistic is the log-normaliser
  of the tempered row, so that a truncation after it (transformers' order)
  decides on candidates when its nucleus lies within them.

  Dynamic temperature is llama.cpp's ``temp_ext``: with ``r = dynatemp_range > 0``
  the row's temperature is ``max(0, t - r) + (t + r - max(0, t - r)) * (H / log N) ** dynatemp_exponent``,
  ``H`` the entropy of the survivors' softmax and ``N`` their number (a row of
  one survivor is left alone); ``<= 0`` is again greedy. Where it differs from
  llama.cpp: llama.cpp's ``N`` counts every entry of its array, ``-inf`` ones
  included (after top-n-σ or a ban, with nothing truncating in between, that
  is the whole vocabulary), and its float32 sums run in sorted order; jsample's
  ``N`` counts the survivors (as the KoboldCpp original does), and its sums
  are trees. It needs the entropy of
  every survivor, so on candidates a row decides only when they cover the row
  (after top-k, say). ``r = 0`` draws no differently, but the program still
  holds the entropy's arithmetic on both paths (about 250 of the 3,600 HLO
  instructions of Gemma's chain): ``dynamic=False`` leaves it out, and the
  two dynatemp settings with it, as llama.cpp's plain ``temp`` sampler.

  Args:
    t: ``temperature``, any finite number; ``<= 0`` means greedy.
    dynatemp_range: ``dynatemp_range``, any finite number; ``<= 0`` is off.
    dynatemp_exponent: ``dynatemp_exponent``, any finite number.
    dynamic: whether the stage has dynamic temperature and its two settings
      (static). The recipes of engines without it (:func:`gemma`, :func:`vllm`,
      :func:`hf`) leave it out.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.temperature(0.0))
    >>> token, _ = sampler.pick(jnp.array([1.0, 3.0, 3.0, 2.0]), sampler.init(seed=0))
    >>> int(token)
    1
    >>> sampler = jsample.chain(jsample.temperature(1.0, dynatemp_range=0.5))
    >>> logits = jnp.log(jnp.array([0.7, 0.2, 0.1]))
    >>> p = sampler.probs(logits, sampler.init(seed=0))  # H / log 3 = 0.73, so the temperature is 1.23
    >>> [round(float(v), 3) for v in p]
    [0.638, 0.23, 0.131]
    >>> [setting.name for setting in jsample.temperature(dynamic=False).settings]
    ['temperature']

  References:
    kalomaze, 2024, "Dynamic Temperature" (KoboldCpp,
    https://github.com/LostRuins/koboldcpp/pull/600), which normalises the
    entropy by that of the tokens not at ``-inf``; llama.cpp's port,
    https://github.com/ggml-org/llama.cpp/pull/4972.
  """
  if not dynamic and (dynatemp_range != 0.0 or dynatemp_exponent != 1.0):
    raise ValueError(
      f"dynatemp_range, dynatemp_exponent: need dynamic=True; got {dynatemp_range!r}, {dynatemp_exponent!r}"
    )
  settings = (
    Setting(
      "temperature",
      t,
      jnp.float32,
      jnp.isfinite,
      "finite (<= 0: greedy)",
      1.0,
      "divide the logits by it: below 1 sharpens, above 1 flattens (<= 0: greedy)",
    ),
    Setting(
      "dynatemp_range",
      dynatemp_range,
      jnp.float32,
      jnp.isfinite,
      "finite (<= 0: off)",
      0.0,
      "dynamic temperature: from temperature - range to + range as the row's entropy rises (<= 0: off)",
    ),
    Setting(
      "dynatemp_exponent",
      dynatemp_exponent,
      jnp.float32,
      jnp.isfinite,
      "finite",
      1.0,
      "dynamic temperature: the exponent on the row's normalised entropy",
    ),
  )[: 3 if dynamic else 1]

  def is_dynamic(s: Settings) -> jax.Array:
    return s["dynatemp_range"] > 0 if dynamic else jnp.bool_(False)

  def row_statistic(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    t = s["temperature"]
    # Only a fixed 0 < t != 1 needs it (t == 1 shifts a known normaliser; greedy covers the row;
    # a dynamic t needs candidates that cover the row): skip the pass otherwise.
    needed = (t > 0) & (t != 1) & ~is_dynamic(s)
    return lax.cond(needed, lambda: logsumexp(_scale(logits, jnp.max(logits), t)), lambda: jnp.float32(0))

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    on = is_dynamic(s)
    # A dynamic t reads every survivor: right where the candidates cover the row, else the row is not decided.
    t = jnp.where(on, _dynamic(c.logits, s), s["temperature"]) if dynamic else s["temperature"]
    best = jnp.max(c.logits)
    alive = c.logits > -jnp.inf
    first = jnp.argmax(alive)  # sampling order: the first survivor is the best
    greedy = jnp.where(jnp.arange(c.ids.shape[0]) == first, c.logits, -jnp.inf)
    # t == 1 only shifts the row, so a known log-normaliser shifts with it; any
    # other fixed t takes the row statistic, which describes the row as the cut
    # gave it: that is this row where the log-normaliser is known. Greedy covers the row.
    statistic = ctx.row_statistic
    return c._replace(
      logits=jnp.where(t > 0, _scale(c.logits, best, t), _scale(greedy, best, t)),
      log_z=jnp.where(t == 1, c.log_z - jnp.where(best > -jnp.inf, best, 0.0), statistic),
      log_z_known=c.log_z_known & ~on & ((t == 1) | ~jnp.isnan(statistic)),
      covers_row=c.covers_row | (t <= 0),
      decided=c.decided & (~on | c.covers_row),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    fixed = s["temperature"]
    t = lax.cond(is_dynamic(s), lambda: _dynamic(logits, s), lambda: fixed) if dynamic else fixed
    best = jnp.max(logits)

    def greedy():
      first = jnp.argmax(logits)  # ties to the lower id
      return _scale(jnp.where(jnp.arange(logits.shape[0]) == first, logits, -jnp.inf), best, t)

    return lax.cond(t > 0, lambda: _scale(logits, best, t), greedy)

  return Stage(
    "temperature",
    settings,
    on_candidates,
    on_row,
    row_statistic=row_statistic,
    # A dynamic t is max(0, t - r) + ... > 0 unless the entropy is 0: t <= 0 is greedy only without it.
    only_best=lambda s: (s["temperature"] <= 0) & ~is_dynamic(s),
    argmax_invariant=lambda s: jnp.bool_(True),
  )
