"""What every reader shares: :class:`Config`, the field checks, and the last step."""

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from jsample._src import recipes
from jsample._src.sampler import Sampler


class Config(NamedTuple):
  """What a reader builds: the sampler, one row's settings for ``init``, and the rest.

  Attributes:
    sampler: the recipe's :class:`Sampler`, sized for the request's lists.
    settings: keyword arguments for :meth:`Sampler.init` (one row).
    extras: fields that are not sampler settings, under the engine's names.

  Examples:
    >>> import jsample
    >>> config = jsample.from_openai({"temperature": 0.7, "seed": 7, "n": 2})
    >>> config.settings["temperature"], config.extras
    (0.7, {'seed': 7, 'n': 2})
    >>> config = jsample.from_openai({"temperature": 0.7, "logit_bias": {"50256": -100}})
    >>> print(config)  # the list settings without their padding  # doctest: +NORMALIZE_WHITESPACE
    Config(sampler=Sampler(allowed_tokens → banned_tokens → min_tokens → logit_bias → penalties → temperature →
                           min_p → top_k → top_p; window_size=64, budget=128, strategy='auto'),
           settings={'temperature': 0.7, 'logit_bias_ids': [50256], 'logit_bias_values': [-100.0],
                     'allowed_token_ids': [], 'banned_token_ids': [], 'eos_token_ids': []},
           extras={})
  """

  sampler: Sampler
  settings: dict
  extras: dict

  def __repr__(self) -> str:
    # List settings are padded to their stage's static size: shown without the padding (-1 ids, trailing zeros).
    settings = ", ".join(f"{name!r}: {_unpadded(value)!r}" for name, value in self.settings.items())
    return f"Config(sampler={self.sampler!r},\n       settings={{{settings}}},\n       extras={self.extras!r})"


def _unpadded(value):
  """A padded list setting as a plain list without its padding; any other value as it is."""
  if not isinstance(value, np.ndarray):
    return value
  if np.issubdtype(value.dtype, np.integer):
    if value.ndim == 2:  # DRY's breakers: token-id sequences
      return [row for row in (_unpadded(r) for r in value) if row]
    return [int(v) for v in value if v != -1]
  return [float(v) for v in np.trim_zeros(value, "b")]


# --- checks -------------------------------------------------------------------


def _number(field: str, value, lo=-math.inf, hi=math.inf, *, integer=False, lo_open=False, hi_open=False):
  """``value`` as a float (an int where ``integer``), or a ValueError naming ``field``."""
  kind = (int,) if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kind):
    raise ValueError(f"{field}: must be {'an integer' if integer else 'a number'}; got {value!r}")
  if math.isnan(value) or (value < lo or value > hi) or (lo_open and value == lo) or (hi_open and value == hi):
    ends = ("(" if lo_open else "[") + f"{lo}, {hi}" + (")" if hi_open else "]")
    raise ValueError(f"{field}: must be in {ends}; got {value!r}")
  return value if integer else float(value)


def _ids(field: str, value, *, allow_empty: bool = True) -> list[int]:
  """A list of token ids (ints >= 0)."""
  if isinstance(value, bool) or not isinstance(value, list | tuple):
    raise ValueError(f"{field}: must be a list of token ids; got {value!r}")
  for v in value:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      raise ValueError(f"{field}: token ids must be integers >= 0; got {v!r}")
  if not value and not allow_empty:
    raise ValueError(f"{field}: must not be empty")
  return list(value)


def _one_or_many_ids(field: str, value) -> list[int]:
  """An id or a list of ids (transformers' ``eos_token_id``)."""
  return _ids(field, [value] if isinstance(value, int) and not isinstance(value, bool) else value)


def _flag(field: str, value) -> bool:
  if not isinstance(value, bool):
    raise ValueError(f"{field}: must be true or false; got {value!r}")
  return value


def _text(field: str, value) -> str:
  if not isinstance(value, str):
    raise ValueError(f"{field}: must be a string; got {value!r}")
  return value


def _anything(field: str, value):
  return value


def _read(request: Mapping, fields: dict[str, Callable], what: str) -> dict:
  """Every field of ``request`` through its check; an unknown field raises."""
  if not isinstance(request, Mapping):
    raise ValueError(f"{what}: must be a mapping of fields; got {type(request).__name__}")
  out = {}
  for name, value in request.items():
    if name not in fields:
      raise ValueError(f"{name}: not a field this reader knows ({what}); its fields are {sorted(fields)}")
    out[name] = fields[name](name, value)
  return out


def _size(at_least: int, n: int) -> int:
  """A static list size: the recipe's default, or the request's length if longer."""
  return max(at_least, n)


def _biases(pairs: dict[int, float]) -> dict:
  return dict(logit_bias_ids=list(pairs), logit_bias_values=[pairs[k] for k in pairs])


def _finish(sampler: Sampler, settings: dict, extras: dict) -> Config:
  """Pads list settings to the sampler's sizes and checks every value as ``init`` will."""
  specs = sampler.settings
  done: dict[str, Any] = {}
  for name, value in settings.items():
    spec = specs[name]
    done[name] = recipes.padded(spec, value) if spec.shape else value
  sampler.init(seed=0, **done)  # raises here, naming the setting, rather than later
  return Config(sampler, done, extras)
