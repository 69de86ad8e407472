"""The sampler state: what a row carries from step to step, and the ring buffer of recent tokens."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jsample._src import validation
from jsample._src.stage import window_slot


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

  Examples:
    >>> import jsample
    >>> state = jsample.gemma(window_size=4).init(seed=[1, 2], prompt=[[7, 8], [9]], temperature=[0.5, 1.0])
    >>> state.position.tolist(), state.window.tolist(), state.settings["temperature"].tolist()
    ([2, 1], [[7, 8, -1, -1], [9, -1, -1, -1]], [0.5, 1.0])
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


def fork(state: SamplerState, n: int) -> SamplerState:
  """Each row of ``state`` (a single row's: one) as ``n`` rows in a row, the ``j``-th with the stream
  ``fold_in(key, j)``."""
  if state.position.ndim == 0:
    state = jax.tree.map(lambda a: a[None], state)
  keys = jax.vmap(lambda key: jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(n)))(state.key)
  copies = jax.tree.map(lambda a: jnp.repeat(a, n, axis=0), state)
  return copies._replace(key=keys.reshape(-1))


def load(window: jax.Array, position: jax.Array, prompt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Appends one row's prompt (``-1`` entries skipped) to its ring buffer."""
  (width,) = window.shape
  present = prompt >= 0
  rank = jnp.cumsum(present.astype(jnp.int32)) - 1
  count = jnp.sum(present.astype(jnp.int32))
  if width:
    # Only the last W tokens fit; they land on distinct slots.
    fits = present & (rank >= count - width)
    slot = jnp.where(fits, window_slot(position + rank, width), width)
    window = window.at[slot].set(prompt, mode="drop")
  return window, position + count


def load_prompt(prompt, state: SamplerState) -> SamplerState:
  """:meth:`Sampler.load_prompt` on a checked ``[L]`` or ``[B, L]`` prompt: one row's, or every row's of a batch."""
  batched = state.position.ndim == 1
  if prompt.ndim == 2 and not batched:
    raise ValueError(f"prompt: a [B, L] prompt needs a batched state; got shape {prompt.shape}")
  prompt = jnp.asarray(prompt, jnp.int32)
  if batched:
    prompt = jnp.broadcast_to(prompt, state.position.shape + prompt.shape[-1:])
    window, position = jax.vmap(load)(state.window, state.position, prompt)
  else:
    window, position = load(state.window, state.position, prompt)
  return state._replace(window=window, position=position)


def append(window: jax.Array, position: jax.Array, token: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Appends one token to one row's ring buffer (no write pointer: slot ``position % W``)."""
  (width,) = window.shape
  if width:
    window = jax.lax.dynamic_update_index_in_dim(window, token.astype(window.dtype), window_slot(position, width), 0)
  return window, position + 1


def create(known: dict, stages, window_size: int, check, seed, key, batch, prompt, settings: dict):
  """The fresh state :meth:`Sampler.init` returns, before its prompt is loaded; and the prompt as an array.

  Args:
    known: the chain's settings by name; ``check(setting, value)`` checks one value.
    stages: the chain's stages (those with state give their initial state).
    window_size: ``W``.
    seed, key, batch, prompt, settings: as :meth:`Sampler.init` takes them.
  """
  unknown = sorted(set(settings) - set(known))
  if unknown:
    raise ValueError(f"{unknown[0]}: not a setting of this sampler; its settings are {sorted(known)}")
  if seed is not None and key is not None:
    raise ValueError("seed, key: give one of them, not both")
  for name, value in settings.items():
    check(known[name], value)
  if key is not None and not jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
    raise ValueError(
      "key: must be typed PRNG keys from jax.random.key (or jax.random.wrap_key_data); "
      f"got dtype {jnp.asarray(key).dtype}"
    )
  if seed is not None and validation.is_concrete(seed):
    seeds = np.asarray(seed)
    if not np.issubdtype(seeds.dtype, np.integer) or np.any(seeds < 0) or np.any(seeds >= 2**32):
      raise ValueError(f"seed: must be integers in [0, 2**32); got {seed!r}")
  if prompt is not None:
    prompt = as_prompt(prompt)

  shapes = {name: validation.rows_of(known[name], v) for name, v in settings.items()}
  for name, value in (("seed", seed), ("key", key)):
    if value is not None:
      shapes[name] = np.shape(value)
      if len(shapes[name]) > 1:
        raise ValueError(f"{name}: must be a scalar or one value per row [B]; got shape {shapes[name]}")
  if prompt is not None and prompt.ndim == 2:
    shapes["prompt"] = prompt.shape[:1]
  sizes = {name: shape[0] for name, shape in shapes.items() if shape}
  if batch is not None:
    sizes["batch"] = batch
  if len(set(sizes.values())) > 1:
    raise ValueError(f"batch sizes disagree: {sizes}")
  rows = () if not sizes else (next(iter(sizes.values())),)

  if key is None:
    per_row = jnp.broadcast_to(jnp.asarray(0 if seed is None else seed, jnp.uint32), rows)
    key = jax.vmap(jax.random.key)(per_row.reshape(-1)).reshape(rows)
  else:
    key = jnp.broadcast_to(key, rows)
  values = {
    name: jnp.broadcast_to(jnp.asarray(settings.get(name, s.default), s.dtype), rows + s.shape)
    for name, s in known.items()
  }
  own = {
    stage.name: jax.tree.map(lambda a: jnp.broadcast_to(a, rows + jnp.shape(a)), stage.init_state())
    for stage in stages
    if stage.init_state is not None
  }
  fresh = SamplerState(
    key=key,
    position=jnp.zeros(rows, jnp.int32),
    window=jnp.full(rows + (window_size,), -1, jnp.int32),
    settings=values,
    stages=own,
  )
  return fresh, prompt
