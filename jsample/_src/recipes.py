"""Recipes: the chains other engines run, with their declared defaults.

Every recipe is a plain :func:`chain`; its keyword arguments override the
defaults of its settings and its static sizes.
"""

from jsample._src.penalties import penalties
from jsample._src.sampler import Sampler, chain
from jsample._src.temperature import temperature as temperature_stage
from jsample._src.truncation import min_p as min_p_stage
from jsample._src.truncation import top_k as top_k_stage
from jsample._src.truncation import top_p as top_p_stage


def llama_cpp(
  *,
  temperature: float = 0.8,
  top_k: int = 40,
  top_p: float = 0.95,
  min_p: float = 0.05,
  repeat_penalty: float = 1.0,
  frequency_penalty: float = 0.0,
  presence_penalty: float = 0.0,
  penalty_last_n: int = -1,
  window: int = 64,
  candidates: int = 256,
  vocab_size: int | None = None,
) -> Sampler:
  """llama.cpp's default chain and defaults.

  Order: penalties → top-k → top-p → min-p → temperature → draw, with
  llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
  neutral penalties over the last 64 tokens).

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> sampler = jsample.llama_cpp(temperature=0.0)
    >>> token, state = jax.jit(sampler.pick)(jnp.array([0.0, 1.0, 3.0]), sampler.init(seed=0))
    >>> int(token)
    2
  """
  return chain(
    penalties(repeat_penalty, frequency_penalty, presence_penalty, penalty_last_n),
    top_k_stage(top_k),
    top_p_stage(top_p),
    min_p_stage(min_p),
    temperature_stage(temperature),
    window=window,
    candidates=candidates,
    vocab_size=vocab_size,
  )


def gemma(**overrides) -> Sampler:
  """The llama.cpp chain with Gemma's declared generation defaults.

  Temperature 1.0, top-k 64, top-p 0.95 (Gemma's ``generation_config``), with
  llama.cpp's min-p 0.05 and neutral penalties over a 64-token window. Takes
  the keywords of :func:`llama_cpp`.

  Examples:
    >>> import jsample
    >>> float(jsample.gemma().init(seed=0).settings["temperature"])
    1.0
  """
  return llama_cpp(**{"temperature": 1.0, "top_k": 64, "top_p": 0.95, **overrides})


def hf(
  *,
  temperature: float = 1.0,
  top_k: int = 50,
  top_p: float = 1.0,
  min_p: float = 0.0,
  repeat_penalty: float = 1.0,
  frequency_penalty: float = 0.0,
  presence_penalty: float = 0.0,
  penalty_last_n: int = -1,
  window: int = 64,
  candidates: int = 256,
  vocab_size: int | None = None,
) -> Sampler:
  """Hugging Face transformers' order: temperature *before* truncation.

  Order: penalties → temperature → top-k → top-p → min-p → draw, so every
  truncation sees the tempered distribution, as transformers' logits warpers
  do; defaults are its ``GenerationConfig``'s (temperature 1.0, top-k 50).
  The arithmetic of each stage (ties, the crossing token of top-p, the
  penalties) stays jsample's, i.e. llama.cpp's.

  Examples:
    >>> import jsample
    >>> [stage.name for stage in jsample.hf().stages]
    ['penalties', 'temperature', 'top_k', 'top_p', 'min_p']
  """
  return chain(
    penalties(repeat_penalty, frequency_penalty, presence_penalty, penalty_last_n),
    temperature_stage(temperature),
    top_k_stage(top_k),
    top_p_stage(top_p),
    min_p_stage(min_p),
    window=window,
    candidates=candidates,
    vocab_size=vocab_size,
  )
