"""The sampler state: what a row carries from step to step, and the ring buffer of recent tokens."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class SamplerState(NamedTuple):
  """Everything a row carries from step to step: a pytree of arrays.

  Shapes are for a batch of ``B`` rows; a single row drops the ``B`` axis.

  Attributes:
    key: ``[B]`` typed PRNG keys, one per row. The step key is
      ``fold_in(key, position)``, so a row's draw never depends on its batch.
    position: ``[B]`` int32, tokens accepted so far (prompt included).
    window: ``[B, W]`` int32 ring buffer of recent tokens, ``-1`` when empty;
      token number ``n`` sits at ``n % W``.
    settings: name -> ``[B]`` (or ``[B, N]``) array, every setting per row.
    stages: stage name -> that stage's own state, batched like the rows,
      for the stages that keep one.
  """

  key: jax.Array
  position: jax.Array
  window: jax.Array
  settings: dict[str, jax.Array]
  stages: dict[str, Any] = {}


def as_prompt(prompt) -> np.ndarray | jax.Array:
  """A prompt as ``[L]`` or ``[B, L]`` integers, lists of lists padded with -1."""
  if isinstance(prompt, list | tuple):
    nested = bool(prompt) and all(np.ndim(p) == 1 for p in prompt)
    try:
      rows = [np.asarray(p) for p in prompt] if nested else [np.asarray(prompt)]
    except ValueError as error:
      raise ValueError(f"prompt: must be [L], [B, L] or a list of lists of token ids; {error}") from None
    for row in rows:
      if row.size and not np.issubdtype(row.dtype, np.integer):
        raise ValueError(f"prompt: token ids must be integers; got dtype {row.dtype}")
    if not nested:
      prompt = rows[0].astype(np.int64) if rows[0].size else np.zeros((0,), np.int64)
    else:
      prompt = np.full((len(rows), max(r.size for r in rows)), -1, np.int64)
      for i, row in enumerate(rows):
        prompt[i, : row.size] = row
  elif not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise ValueError(f"prompt: token ids must be integers; got dtype {prompt.dtype}")
  if prompt.ndim not in (1, 2):
    raise ValueError(f"prompt: must be [L] or [B, L]; got shape {prompt.shape}")
  return prompt


def load(window: jax.Array, position: jax.Array, prompt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Appends one row's prompt (``-1`` entries skipped) to its ring buffer."""
  (width,) = window.shape
  present = prompt >= 0
  rank = jnp.cumsum(present.astype(jnp.int32)) - 1
  count = jnp.sum(present.astype(jnp.int32))
  if width:
    # Only the last W tokens fit; they land on distinct slots.
    fits = present & (rank >= count - width)
    slot = jnp.where(fits, jnp.mod(position + rank, width), width)
    window = window.at[slot].set(prompt, mode="drop")
  return window, position + count


def append(window: jax.Array, position: jax.Array, token: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Appends one token to one row's ring buffer (no write pointer: slot ``position % W``)."""
  (width,) = window.shape
  if width:
    window = window.at[jnp.mod(position, width)].set(token)
  return window, position + 1
