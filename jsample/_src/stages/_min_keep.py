"""``min_keep``, the setting that top-p, min-p, typical and XTC share."""

import jax.numpy as jnp

from jsample._src.stage import Setting


def _non_negative(v):
  return v >= 0


def min_keep_setting(n: int = 0) -> Setting:
  """``min_keep``, shared by the stages that take one (top-p, min-p, typical, XTC), as llama.cpp passes one to all.

  Every such stage declares it with this function, so that a chain holds one
  value per row (:class:`Stage` shares settings declared alike).
  """
  return Setting(
    "min_keep",
    n,
    jnp.int32,
    _non_negative,
    "an integer >= 0",
    0,
    "top-p, min-p, typical and XTC keep at least this many tokens (0 and 1 alike)",
  )
