"""Arithmetic on one row of logits that stages and kernels share."""

import jax
import jax.numpy as jnp


def logsumexp(logits: jax.Array) -> jax.Array:
  """``log Σ exp`` that returns ``-inf`` (not NaN) when every entry is ``-inf``."""
  top = jnp.max(logits)
  shift = jnp.where(top > -jnp.inf, top, 0.0)
  return shift + jnp.log(jnp.sum(jnp.exp(logits - shift)))


def entropy(logits: jax.Array, log_z: jax.Array) -> jax.Array:
  """``H = Σ p (log_z - logit)`` in nats over the survivors (``0 log 0 = 0``), given their ``log_z``."""
  surprise = jnp.where(logits > -jnp.inf, log_z - logits, 0.0)
  return jnp.sum(jnp.exp(-surprise) * surprise)
