"""Probability floors: epsilon sampling (a fixed floor) and eta sampling (an entropy-dependent one),
as transformers' ``EpsilonLogitsWarper`` and ``EtaLogitsWarper``."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.kernels.rowmath import entropy, logsumexp
from jsample._src.kernels.search import shortest_prefix
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage
from jsample._src.stages._min_keep import min_keep_setting


def cutoff_setting(name: str, value: float, help: str) -> Setting:
  """A probability floor in ``[0, 1)``; 0 turns its stage off (transformers' ``*_cutoff = 0.0``)."""
  return Setting(name, value, jnp.float32, lambda v: (v >= 0) & (v < 1), "in [0, 1) (0: off)", 0.0, help)


def kth(logits: jax.Array, least: jax.Array, covers_row: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(the min_keep-th best logit of candidates [K], whether it is known)``.

  transformers keeps every token whose score reaches the ``min_tokens_to_keep``-th
  best (ties included); ``min_keep`` 0 and 1 alike keep the best. Where fewer
  candidates survive than that and others lie beyond them, it is unknown.
  """
  k = jnp.maximum(least, 1)
  (size,) = logits.shape
  alive = jnp.sum(logits > -jnp.inf)
  desc = -jnp.sort(-logits)
  value = jnp.where(k <= size, desc[jnp.clip(k - 1, 0, size - 1)], -jnp.inf)
  return value, covers_row | (k <= alive)


def row_kth(logits: jax.Array, least: jax.Array, ctx: Context) -> jax.Array:
  """The ``min_keep``-th best logit of a full row ``[V]``, found without sorting it."""
  alive = logits > -jnp.inf

  def search():
    # The shortest prefix in sampling order that holds `least` survivors ends at the k-th best.
    keep = shortest_prefix(jnp.where(alive, logits, -jnp.inf), alive.astype(jnp.int32), least)
    return jnp.min(jnp.where(keep & alive, logits, jnp.inf))

  return lax.cond(least > 1, search, lambda: jnp.max(logits))


def floor_stage(name: str, setting: Setting, min_keep: int, log_floor, row_statistic=None) -> Stage:
  """A stage that removes tokens with ``logit - log_z < log_floor(settings, H)`` unless among the ``min_keep`` best.

  Args:
    name: the stage's name.
    setting: its cutoff, 0 off.
    min_keep: the default of the shared ``min_keep``.
    log_floor: ``(settings, entropy or None) -> log of the probability floor``.
    row_statistic: the stage's :attr:`Stage.row_statistic`, when the floor needs the
      row's entropy (eta); None when it does not (epsilon).
  """
  cut = setting.name
  wants_entropy = row_statistic is not None

  def on_candidates(c: Candidates, s: Settings, ctx: Context) -> Candidates:
    off = ~(s[cut] > 0)
    log_z, known = c.log_normaliser()
    if wants_entropy:
      h = jnp.where(c.covers_row, entropy(c.logits, log_z), ctx.row_statistic)
      known = c.covers_row | (c.log_z_known & ~jnp.isnan(ctx.row_statistic))
      floor = log_floor(s, h)
    else:
      floor = log_floor(s, None)
    top, top_known = kth(c.logits, s["min_keep"], c.covers_row)
    keep = (c.logits - log_z >= floor) | (c.logits >= top)
    # Tokens beyond the candidates rank at or below the last one: if it falls, so do they.
    last_out = (c.logits[-1] - log_z < floor) & (c.logits[-1] < top)
    covers = c.covers_row | (known & top_known & last_out)
    return c.keep(keep | off)._replace(
      covers_row=jnp.where(off, c.covers_row, covers),
      log_z_known=c.log_z_known & off,  # removing tokens changes the row's normaliser
      decided=c.decided & (off | (known & top_known & covers)),
    )

  def on_row(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    def apply():
      log_z = logsumexp(logits)
      floor = log_floor(s, entropy(logits, log_z) if wants_entropy else None)
      keep = (logits - log_z >= floor) | (logits >= row_kth(logits, s["min_keep"], ctx))
      return jnp.where(keep, logits, -jnp.inf)

    return lax.cond(s[cut] > 0, apply, lambda: logits)

  return Stage(
    name,
    (setting, min_keep_setting(min_keep)),
    on_candidates,
    on_row,
    argmax_invariant=lambda s: jnp.bool_(True),  # the best token always reaches the min_keep-th best
    row_statistic=row_statistic,
  )


def epsilon(cutoff: float = 0.0, min_keep: int = 0) -> Stage:
  """Epsilon sampling: removes the tokens less likely than ``epsilon_cutoff``.

  A token survives if ``p_i >= epsilon_cutoff`` (``p`` the softmax of the
  current survivors) or its logit reaches the ``min_keep``-th best (ties
  included; ``min_keep`` 0 and 1 keep the best), as transformers'
  ``EpsilonLogitsWarper`` with ``min_tokens_to_keep = max(min_keep, 1)``.
  ``0`` is off. The test is ``logit - log Z >= log epsilon`` in float32.

  Args:
    cutoff: ``epsilon_cutoff``, in ``[0, 1)``; 0 is off.
    min_keep: ``min_keep``, shared with the other stages that take it.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.epsilon(0.1), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> [round(float(v), 3) for v in sampler.probs(logits, sampler.init(seed=0))]
    [0.526, 0.316, 0.158, 0.0]

  References:
    Hewitt et al., 2022, "Truncation Sampling as Language Model Desmoothing".
  """
  setting = cutoff_setting("epsilon_cutoff", cutoff, "epsilon sampling: drop tokens less likely than this (0: off)")
  return floor_stage("epsilon", setting, min_keep, lambda s, h: jnp.log(s["epsilon_cutoff"]))


def eta(cutoff: float = 0.0, min_keep: int = 0) -> Stage:
  """Eta sampling: removes the tokens less likely than ``min(eta, sqrt(eta) exp(-H))``.

  ``H`` is the entropy in nats of the current survivors' softmax; a token
  survives if its probability reaches the floor or its logit reaches the
  ``min_keep``-th best (ties included; 0 and 1 keep the best), as
  transformers' ``EtaLogitsWarper`` with ``min_tokens_to_keep = max(min_keep,
  1)``. ``0`` is off. The entropy is a statistic of the whole row: on
  candidates the stage reads it from the row statistics where they describe
  the row it sees, else it decides on the full row.

  Args:
    cutoff: ``eta_cutoff``, in ``[0, 1)``; 0 is off.
    min_keep: ``min_keep``, shared with the other stages that take it.

  Returns:
    A :class:`Stage`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.eta(0.3), jsample.temperature(1.0))
    >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    >>> p = sampler.probs(logits, sampler.init(seed=0))  # H = 1.14 nats: floor sqrt(0.3) e^-H = 0.175
    >>> [round(float(v), 3) for v in p]
    [0.625, 0.375, 0.0, 0.0]

  References:
    Hewitt et al., 2022, "Truncation Sampling as Language Model Desmoothing".
  """
  setting = cutoff_setting("eta_cutoff", cutoff, "eta sampling: drop tokens below min(eta, sqrt(eta) exp(-H)) (0: off)")

  def log_floor(s: Settings, h) -> jax.Array:
    e = s["eta_cutoff"]
    return jnp.log(jnp.minimum(e, jnp.sqrt(e) * jnp.exp(-h)))

  def row_statistic(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    return lax.cond(s["eta_cutoff"] > 0, lambda: entropy(logits, logsumexp(logits)), lambda: jnp.float32(0))

  return floor_stage("eta", setting, min_keep, log_floor, row_statistic=row_statistic)
