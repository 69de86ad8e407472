"""Token masks: boolean ``[..., V]`` rows or packed int32 ``[..., M]`` bitmasks.

The packed layout is the one XGrammar, llguidance and outlines-core produce:
bit ``j % 32`` of word ``j // 32`` is set when token ``j`` is allowed.
"""

import jax
import jax.numpy as jnp
import numpy as np


def words_for(vocab: int) -> int:
  """``M``, the number of int32 words that hold one packed row of ``vocab`` bits."""
  return -(-vocab // 32)


def pack(allowed: jax.Array) -> jax.Array:
  """Packs a boolean mask ``[..., V]`` into int32 words ``[..., M]``.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> jsample.pack_mask(jnp.array([True, False, True])).tolist()
    [5]
  """
  allowed = jnp.asarray(allowed, dtype=bool)
  vocab = allowed.shape[-1]
  pad = words_for(vocab) * 32 - vocab
  widths = [(0, 0)] * (allowed.ndim - 1) + [(0, pad)]
  # Explicit sizes, not -1: a reshape cannot infer one when there are 0 rows.
  bits = jnp.pad(allowed, widths).reshape(*allowed.shape[:-1], words_for(vocab), 32)
  weights = jnp.uint32(1) << jnp.arange(32, dtype=jnp.uint32).reshape((1,) * (bits.ndim - 1) + (32,))
  words = jnp.sum(jnp.where(bits, weights, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
  return jax.lax.bitcast_convert_type(words, jnp.int32)


def unpack(words: jax.Array, vocab: int) -> jax.Array:
  """Unpacks int32 (or uint32) words ``[..., M]`` into a boolean mask ``[..., V]``.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> jsample.unpack_mask(jnp.array([5], jnp.int32), 3).tolist()
    [True, False, True]
  """
  words = jax.lax.bitcast_convert_type(jnp.asarray(words), jnp.uint32)
  shifts = jnp.arange(32, dtype=jnp.uint32).reshape((1,) * words.ndim + (32,))
  bits = (words[..., None] >> shifts) & jnp.uint32(1)
  return bits.reshape(*words.shape[:-1], words.shape[-1] * 32)[..., :vocab] == 1


def allowed_at(mask: jax.Array, ids: jax.Array) -> jax.Array:
  """Whether the tokens ``ids`` are allowed by one row's mask, bool ``[V]`` or packed ``[M]``.

  Ids past the row (padding) read as disallowed.
  """
  if mask.dtype == jnp.bool_:
    return jnp.take(mask, ids, mode="fill", fill_value=False)
  words = jax.lax.bitcast_convert_type(mask, jnp.uint32)
  word = jnp.take(words, ids >> 5, mode="fill", fill_value=0)
  return ((word >> (ids & 31).astype(jnp.uint32)) & jnp.uint32(1)) == 1


def check(mask: jax.Array, logits_shape: tuple[int, ...]) -> None:
  """Raises ``ValueError`` unless ``mask`` is a bool or packed mask for these logits."""
  vocab = logits_shape[-1]
  dtype = np.dtype(mask.dtype)
  if dtype == np.bool_:
    if mask.shape != logits_shape:
      raise ValueError(f"mask: a boolean mask must have the logits' shape {logits_shape}; got {mask.shape}")
  elif dtype in (np.int32, np.uint32):
    if mask.shape != logits_shape[:-1] + (words_for(vocab),):
      raise ValueError(
        f"mask: a packed mask must be {logits_shape[:-1] + (words_for(vocab),)}: int32 words, ceil(V/32) "
        f"per row for V={vocab}; got {mask.shape}"
      )
  else:
    raise ValueError(f"mask: must be bool [..., V] or packed int32 [..., ceil(V/32)]; got dtype {dtype}")
