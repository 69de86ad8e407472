"""Recipes: the chains other engines run, with their declared defaults.

Every recipe is a plain :func:`chain`. Its keyword arguments override the
defaults of its settings (``temperature``, ``top_k``, ``top_p``, ``min_p``,
``repeat_penalty``, ``frequency_penalty``, ``presence_penalty``,
``penalty_last_n``) and its static sizes (``window_size``, ``budget``,
``vocab_size``) and ``strategy``.
"""

from collections.abc import Callable

from jsample._src.penalties import penalties
from jsample._src.sampler import Sampler, chain
from jsample._src.stage import Stage
from jsample._src.temperature import temperature as temperature_stage
from jsample._src.truncation import min_p as min_p_stage
from jsample._src.truncation import top_k as top_k_stage
from jsample._src.truncation import top_p as top_p_stage

_STAGES: dict[str, Callable[[], Stage]] = {
  "penalties": penalties,
  "top_k": top_k_stage,
  "top_p": top_p_stage,
  "min_p": min_p_stage,
  "temperature": temperature_stage,
}
_SIZES = ("window_size", "budget", "vocab_size", "strategy")


def _recipe(order: tuple[str, ...], defaults: dict, overrides: dict) -> Sampler:
  """The chain of ``order``'s stages, each setting's default from ``overrides``, then ``defaults``."""
  stages = [_STAGES[name]() for name in order]
  known = {s.name for stage in stages for s in stage.settings}
  unknown = sorted(overrides.keys() - known - set(_SIZES))
  if unknown:
    raise ValueError(f"{unknown[0]}: not a keyword of this recipe; its keywords are {sorted(known | set(_SIZES))}")
  values = {**defaults, **overrides}
  stages = [
    stage._replace(settings=tuple(s._replace(default=values.get(s.name, s.default)) for s in stage.settings))
    for stage in stages
  ]
  return chain(*stages, **{name: values[name] for name in _SIZES if name in values})


_LLAMA_CPP_ORDER = ("penalties", "top_k", "top_p", "min_p", "temperature")


def llama_cpp(**overrides) -> Sampler:
  """llama.cpp's default chain and defaults.

  Order: penalties → top-k → top-p → min-p → temperature → draw, with
  llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
  neutral penalties over the whole 64-token window.

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> sampler = jsample.llama_cpp(temperature=0.0)
    >>> token, state = jax.jit(sampler.pick)(jnp.array([0.0, 1.0, 3.0]), sampler.init(seed=0))
    >>> int(token)
    2
  """
  defaults = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
  return _recipe(_LLAMA_CPP_ORDER, defaults, overrides)


def gemma(**overrides) -> Sampler:
  """The llama.cpp chain with Gemma's declared generation defaults.

  Temperature 1.0, top-k 64, top-p 0.95 (Gemma's ``generation_config``), with
  llama.cpp's min-p 0.05 and neutral penalties over a 64-token window.

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jsample
    >>> float(jsample.gemma().init(seed=0).settings["temperature"])
    1.0
  """
  defaults = dict(temperature=1.0, top_k=64, top_p=0.95, min_p=0.05)
  return _recipe(_LLAMA_CPP_ORDER, defaults, overrides)


def hf(**overrides) -> Sampler:
  """Hugging Face transformers' order: temperature *before* truncation.

  Order: penalties → temperature → top-k → top-p → min-p → draw, so every
  truncation sees the tempered distribution, as transformers' logits warpers
  do; defaults are its ``GenerationConfig``'s (temperature 1.0, top-k 50,
  top-p and min-p off). The arithmetic of each stage (ties, the crossing token
  of top-p, the penalties) stays jsample's, i.e. llama.cpp's.

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jsample
    >>> [stage.name for stage in jsample.hf().stages]
    ['penalties', 'temperature', 'top_k', 'top_p', 'min_p']
  """
  defaults = dict(temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)
  return _recipe(("penalties", "temperature", "top_k", "top_p", "min_p"), defaults, overrides)
