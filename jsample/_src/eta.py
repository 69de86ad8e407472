"""Eta sampling: an entropy-dependent probability floor (transformers' ``EtaLogitsWarper``)."""

import jax
import jax.numpy as jnp
from jax import lax

from jsample._src.epsilon import cutoff_setting, floor_stage
from jsample._src.stage import Context, Settings, Stage, entropy, logsumexp


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

  def row_stat(logits: jax.Array, s: Settings, ctx: Context) -> jax.Array:
    return lax.cond(s["eta_cutoff"] > 0, lambda: entropy(logits, logsumexp(logits)), lambda: jnp.float32(0))

  return floor_stage("eta", setting, min_keep, log_floor, row_stat=row_stat)
