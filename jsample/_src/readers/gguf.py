"""The GGUF ``general.sampling.*`` reader, and llama.cpp's sampler names and order."""

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jsample._src import recipes
from jsample._src.readers.fields import Config, _finish, _number, _text
from jsample._src.sampler import Sampler

_GGUF_PREFIX = "general.sampling."
# llama.cpp's sampler names (common_sampler_type_from_name, with its aliases) and the stage each is.
_LLAMA_NAMES = {
  "penalties": "penalties",
  "dry": "dry",
  "top_n_sigma": "top_n_sigma",
  "top-n-sigma": "top_n_sigma",
  "top_k": "top_k",
  "top-k": "top_k",
  "typ_p": "typical",
  "typical_p": "typical",
  "typical-p": "typical",
  "typical": "typical",
  "typ-p": "typical",
  "typ": "typical",
  "top_p": "top_p",
  "top-p": "top_p",
  "nucleus": "top_p",
  "min_p": "min_p",
  "min-p": "min_p",
  "xtc": "xtc",
  "temperature": "temperature",
  "temp": "temperature",
}


def _order(field: str, names: list) -> tuple[str, ...]:
  """A llama.cpp sampler sequence as a :func:`jsample.llama_cpp`-style stage order."""
  order = []
  for name in names:
    if not isinstance(name, str) or name not in _LLAMA_NAMES:
      raise ValueError(f"{field}: unknown sampler {name!r}; known: {sorted(_LLAMA_NAMES)}")
    if _LLAMA_NAMES[name] not in order:
      order.append(_LLAMA_NAMES[name])
  # penalties and DRY act before the cut to candidates, so they must lead (llama.cpp's default order).
  touching = [n for n in order if n in ("penalties", "dry")]
  if order[: len(touching)] != touching:
    raise ValueError(f"{field}: penalties and dry must come before every other sampler in jsample; got {names}")
  # Samplers left out of the sequence are left out of the chain; logit bias and mirostat are always in it.
  return ("logit_bias", *order, "mirostat")


def _llama_cpp_sampler(order: tuple[str, ...], settings: dict, sizes: dict) -> tuple[Sampler, dict]:
  """``order``'s chain at its stages' defaults (:func:`jsample.llama_cpp`'s, llama.cpp's), and ``settings`` neutral
  where mirostat is on."""
  sampler = recipes.chain_of(order, {}, sizes)
  known = sampler.settings
  for name in settings:
    if name not in known:  # llama.cpp would ignore it silently; jsample says so
      raise ValueError(f"{name}: its sampler is not in the sequence {list(order[1:-1])}")
  neutral = recipes.mirostat_neutral(settings)
  return sampler, {k: v for k, v in neutral.items() if k in known}


_GGUF_KEYS: dict[str, tuple[str, Callable]] = {
  "top_k": ("top_k", lambda f, v: _number(f, v, integer=True)),
  "top_p": ("top_p", lambda f, v: _number(f, v, 0, 1)),
  "min_p": ("min_p", lambda f, v: _number(f, v, 0, 1)),
  "xtc_probability": ("xtc_probability", lambda f, v: _number(f, v, 0, 1)),
  "xtc_threshold": ("xtc_threshold", lambda f, v: _number(f, v, 0, 1)),
  "temp": ("temperature", lambda f, v: _number(f, v, 0)),
  "penalty_last_n": ("penalty_last_n", lambda f, v: _number(f, v, -1, integer=True)),
  "penalty_repeat": ("repeat_penalty", lambda f, v: _number(f, v, 0, lo_open=True)),
  "mirostat": ("mirostat", lambda f, v: _number(f, v, 0, 2, integer=True)),
  "mirostat_tau": ("mirostat_tau", lambda f, v: _number(f, v)),
  "mirostat_eta": ("mirostat_eta", lambda f, v: _number(f, v)),
}


def _gguf_metadata(path) -> dict:
  """The ``general.sampling.*`` keys of a GGUF file, as Python values."""
  import gguf  # an optional dependency (the `gemma` extra)

  out = {}
  for name, field in gguf.GGUFReader(path).fields.items():
    if name.startswith(_GGUF_PREFIX):
      value = field.contents()
      out[name] = float(value) if isinstance(value, np.floating | float) else value
  return out


def from_gguf(source, **sizes) -> Config:
  """Reads the ``general.sampling.*`` keys of a GGUF (a path or its metadata dict) into :func:`jsample.llama_cpp`.

  Keys (llama.cpp's ``gguf`` constants): ``top_k``, ``top_p``, ``min_p``,
  ``xtc_probability``, ``xtc_threshold``, ``temp``, ``penalty_last_n``
  (``-1``: the whole window), ``penalty_repeat``, ``mirostat`` (0, 1, 2),
  ``mirostat_tau``, ``mirostat_eta``, and ``sequence`` (sampler names
  separated by ``;``, as llama.cpp reads it: the stage order; stages left out
  are left out of the chain). Other metadata keys are ignored (they describe
  the model, not sampling); an unknown ``general.sampling.*`` key raises.
  A mirostat model's rows get :func:`jsample.mirostat_neutral` settings.
  No extras: a GGUF holds no seed or lengths for sampling.

  Args:
    source: a path to a ``.gguf`` file, or a mapping of its metadata keys.
    **sizes: static sizes for the recipe.

  Returns:
    A :class:`Config`.

  Examples:
    >>> import jsample
    >>> config = jsample.from_gguf({"general.sampling.top_k": 20, "general.sampling.temp": 0.6})
    >>> int(config.settings["top_k"]), round(float(config.settings["temperature"]), 2)
    (20, 0.6)
  """
  meta = dict(source) if isinstance(source, Mapping) else _gguf_metadata(source)
  settings: dict[str, Any] = {}
  order: tuple[str, ...] = recipes.LLAMA_CPP_ORDER
  for key, value in meta.items():
    if not key.startswith(_GGUF_PREFIX):
      continue
    short = key[len(_GGUF_PREFIX) :]
    if short == "sequence":
      order = _order(key, [n.strip() for n in _text(key, value).split(";") if n.strip()])
    elif short in _GGUF_KEYS:
      name, check = _GGUF_KEYS[short]
      settings[name] = check(key, value.item() if isinstance(value, np.generic) else value)
    else:
      raise ValueError(f"{key}: not a general.sampling key this reader knows; its keys are {sorted(_GGUF_KEYS)}")
  sampler, settings = _llama_cpp_sampler(order, settings, sizes)
  return _finish(sampler, settings, {})
