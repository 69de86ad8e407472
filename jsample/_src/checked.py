"""Checked mode: the problems ``jit`` cannot refuse, reported as errors.

Outside ``jit``, ``init``, ``load_prompt`` and ``accept`` reject bad values with a
``ValueError``. Inside it, values are traced: a state built or changed under
``jit`` can hold a repeat penalty of 0, a window id past the vocabulary, and
logits can hold NaN. By default jsample gives each a defined result (README,
"Guarantees and limits"). A checked sampler instead states each of them with
:func:`jax.experimental.checkify.check`, which raises at once outside ``jit``
and, under ``jit``, once the caller has functionalised the program with
``checkify.checkify``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


class Checks(NamedTuple):
  """What a checked sampler reports besides the settings' ranges and token ids.

  Attributes:
    nan: a NaN logit (by default NaN counts as ``-inf``).
    empty: a row where nothing survives (by default ``Draw.valid`` is False).
  """

  nan: bool = True
  empty: bool = True


def _report(ok: jax.Array, message: str, values: jax.Array | None = None) -> None:
  """Fails unless every entry of ``ok`` holds. ``message`` may name the first
  failing entry's index as ``{at}`` and its value (from ``values``) as ``{value}``."""
  ok = jnp.reshape(ok, -1)
  if not ok.size:
    return
  at = jnp.argmin(ok)
  value = at if values is None else jnp.reshape(values, -1)[at]
  checkify.check(jnp.all(ok), message, at=at, value=value)


def _valid(setting, value: jax.Array) -> jax.Array:
  try:
    return jnp.asarray(setting.valid(value), bool)
  except jax.errors.TracerArrayConversionError:
    raise ValueError(
      f"{setting.name}: its Setting.valid must accept traced arrays in checked mode; use jnp, not np"
    ) from None


def _by_row(ok: jax.Array, value: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """Per row: whether every entry of a vector setting is ok, and its first bad entry."""
  if not shape:
    return ok, value
  rows = value.shape[: value.ndim - len(shape)]
  size = int(np.prod(shape))
  ok, value = ok.reshape(rows + (size,)), value.reshape(rows + (size,))
  first = jnp.argmin(ok, axis=-1)[..., None]
  return jnp.all(ok, axis=-1), jnp.take_along_axis(value, first, axis=-1)[..., 0]


def settings(sampler, state) -> None:
  """Every setting in its range, as ``init`` requires of concrete values."""
  for name, setting in sampler.settings.items():
    value = state.settings[name]
    ok = jnp.broadcast_to(_valid(setting, value), value.shape)
    allowed = setting.allowed.replace("{", "{{").replace("}", "}}")
    ok, first = _by_row(ok, value, setting.shape)
    _report(ok, f"{name}: must be {allowed}; row {{at}} holds {{value}}", first)
    if setting.at_most is not None:
      bound = getattr(sampler, setting.at_most)
      message = f"{name}: must be <= {setting.at_most}={bound}; row {{at}} holds {{value}}"
      below, first = _by_row(value <= bound, value, setting.shape)
      _report(below, message, first)


def tokens(name: str, ids: jax.Array, vocab: int | None, lowest: int) -> None:
  """Token ids in ``[lowest, vocab)``; only ``lowest`` is known without ``vocab``."""
  ids = jnp.asarray(ids)
  ok = ids >= lowest
  if vocab is not None:
    ok &= ids < vocab
  allowed = f"[{lowest}, {vocab})" if vocab is not None else f">= {lowest}"
  _report(ok, f"{name}: token ids must be in {allowed}; entry {{at}} (flat) holds {{value}}", ids)


def inputs(sampler, logits: jax.Array, state) -> None:
  """What :meth:`Sampler.pick` reads: settings, window ids, and NaN if asked."""
  settings(sampler, state)
  tokens("state.window", state.window, logits.shape[-1], lowest=-1)
  if sampler.checking.nan:
    nan = jnp.any(jnp.isnan(logits), axis=-1)
    _report(~nan, "logits: row {at} holds NaN (checked mode; otherwise NaN counts as -inf)")


def drawn(sampler, valid: jax.Array) -> None:
  """A token survived in every row, if asked."""
  if sampler.checking.empty:
    _report(valid, "logits: row {at} has no token left to draw (all masked, -inf or NaN)")
