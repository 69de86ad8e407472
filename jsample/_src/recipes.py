"""Building samplers: :func:`chain` composes stages, and the recipes are the chains other engines run, with their
declared defaults.

Every recipe is a plain :func:`chain`. Its keyword arguments override the
defaults of its settings (any setting of its stages: ``temperature``,
``top_k``, ``dry_multiplier``, ...), its static sizes (``window_size``,
``budget``, ``vocab_size``) and ``strategy``, and the static sizes of its
stages: ``logit_bias_size``, ``allowed_tokens_size``, ``banned_tokens_size``,
``eos_size`` (min_tokens' end-of-sequence list), ``max_breakers`` and
``max_breaker_length`` (DRY).

:func:`chain_of` builds a recipe from an order of :data:`STAGES` names; the
config readers use it for the sampler order a request or a model file gives.
"""

from collections.abc import Callable

import numpy as np

from jsample._src.sampler import Sampler
from jsample._src.stage import Setting, Stage
from jsample._src.stages.dry import dry
from jsample._src.stages.floors import epsilon, eta
from jsample._src.stages.logit_bias import logit_bias
from jsample._src.stages.min_tokens import min_tokens
from jsample._src.stages.mirostat import mirostat
from jsample._src.stages.penalties import penalties
from jsample._src.stages.temperature import temperature as temperature_stage
from jsample._src.stages.token_lists import allowed_tokens, banned_tokens
from jsample._src.stages.top_n_sigma import top_n_sigma
from jsample._src.stages.truncation import min_p as min_p_stage
from jsample._src.stages.truncation import top_k as top_k_stage
from jsample._src.stages.truncation import top_p as top_p_stage
from jsample._src.stages.typical import typical
from jsample._src.stages.xtc import xtc

STAGES: dict[str, tuple[Callable[..., Stage], dict[str, str]]] = {
  "logit_bias": (logit_bias, {"logit_bias_size": "size"}),
  "allowed_tokens": (allowed_tokens, {"allowed_tokens_size": "size"}),
  "banned_tokens": (banned_tokens, {"banned_tokens_size": "size"}),
  "min_tokens": (min_tokens, {"eos_size": "size"}),
  "penalties": (penalties, {}),
  "openai_penalties": (lambda: penalties(scope="openai"), {}),
  "dry": (dry, {"max_breakers": "max_breakers", "max_breaker_length": "max_breaker_length"}),
  "top_n_sigma": (top_n_sigma, {}),
  "top_k": (top_k_stage, {}),
  "typical": (typical, {}),
  "top_p": (top_p_stage, {}),
  "min_p": (min_p_stage, {}),
  "xtc": (xtc, {}),
  "temperature": (temperature_stage, {}),
  "fixed_temperature": (lambda: temperature_stage(dynamic=False), {}),
  "mirostat": (mirostat, {}),
  "epsilon": (epsilon, {}),
  "eta": (eta, {}),
}
"""The stages a recipe's order can name: by name, the stage's factory and the recipe keywords that set its static
sizes (keyword -> the factory's argument). ``openai_penalties`` is :func:`penalties` with OpenAI's scope;
``fixed_temperature`` is :func:`temperature` without dynamic temperature, which only llama.cpp has."""

_SIZES = ("window_size", "budget", "vocab_size", "strategy")


def chain(
  *stages: Stage,
  window_size: int = 64,
  budget: int = 128,
  vocab_size: int | None = None,
  strategy: str = "auto",
) -> Sampler:
  """Composes stages, in the order given, into a :class:`Sampler`.

  The sampler draws from whatever survives the last stage: with temperature
  ``t``, from ``softmax(logits / t)`` over the survivors.

  Args:
    *stages: :class:`Stage` s such as :func:`top_k` or :func:`temperature`.
    window_size: ``W``, the capacity of the recent-token ring buffer.
    budget: ``K``, how many candidates the fast path keeps after its cut.
    vocab_size: optional ``V``, to check prompts and logits against.
    strategy: ``"auto"`` (by JAX's backend), ``"cpu"`` or ``"accelerator"``.

  Returns:
    A :class:`Sampler`.

  Examples:
    >>> import jax.numpy as jnp, jsample
    >>> sampler = jsample.chain(jsample.top_k(2), jsample.temperature(1.0))
    >>> token, state = sampler.pick(jnp.array([0.0, 5.0, 4.0, -1.0]), sampler.init(seed=0))
    >>> int(token) in (1, 2)
    True
  """
  for stage in stages:
    if not isinstance(stage, Stage):
      raise ValueError(f"stages: expected Stage objects (jsample.top_k(...), ...); got {stage!r}")
  return Sampler(tuple(stages), window_size=window_size, budget=budget, vocab_size=vocab_size, strategy=strategy)


def chain_of(order: tuple[str, ...], defaults: dict, overrides: dict) -> Sampler:
  """The chain of ``order``'s stages (names in :data:`STAGES`), each setting's default from ``overrides``, then
  ``defaults``, then its stage's; ``overrides`` may also hold the static sizes (see the module docstring).

  Raises:
    ValueError: a key of ``overrides`` that is neither a setting nor a size of the chain.
  """
  sized = {key: (name, arg) for name in order for key, arg in STAGES[name][1].items()}
  stages = [
    STAGES[name][0](
      **{arg: overrides[key] for key, (owner, arg) in sized.items() if owner == name and key in overrides}
    )
    for name in order
  ]
  known = {s.name for stage in stages for s in stage.settings}
  unknown = sorted(overrides.keys() - known - set(_SIZES) - sized.keys())
  if unknown:
    words = sorted(known | set(_SIZES) | sized.keys())
    raise ValueError(f"{unknown[0]}: not a keyword of this recipe; its keywords are {words}")
  values = {**defaults, **overrides}

  def default(setting):
    if setting.name not in values:
      return setting.default
    if setting.shape:  # a list setting (ids, breakers): the value as its stage pads it
      return padded(setting, values[setting.name])
    return values[setting.name]

  stages = [stage._replace(settings=tuple(s._replace(default=default(s)) for s in stage.settings)) for stage in stages]
  return chain(*stages, **{name: values[name] for name in _SIZES if name in values})


def padded(setting, value) -> np.ndarray:
  """A list setting's value at its static shape, ``-1`` (ids) or ``0`` (biases) padded.

  Raises:
    ValueError: ``value`` has more entries than ``setting.shape`` holds.
  """
  v = np.asarray(value, np.asarray(setting.default).dtype)
  if v.shape == setting.shape:
    return v
  if v.ndim != len(setting.shape) or any(a > b for a, b in zip(v.shape, setting.shape, strict=True)):
    raise ValueError(f"{setting.name}: at most {list(setting.shape)} values; got shape {list(v.shape)}")
  out = np.full(setting.shape, -1 if np.issubdtype(v.dtype, np.integer) else 0, v.dtype)
  out[tuple(slice(0, n) for n in v.shape)] = v
  return out


def settings_of(order: tuple[str, ...]) -> dict[str, Setting]:
  """Each setting of ``order``'s stages (names in :data:`STAGES`) by name, as its stage declares it: its default,
  its neutral value, ... (a setting that several stages share, ``min_keep``, appears once).

  Examples:
    >>> from jsample._src import recipes
    >>> top_k = recipes.settings_of(("top_k", "temperature"))["top_k"]
    >>> top_k.default, top_k.neutral
    (40, 0)
  """
  return {s.name: s for name in order for s in STAGES[name][0]().settings}


LLAMA_CPP_ORDER = (
  "logit_bias",
  "penalties",
  "dry",
  "top_n_sigma",
  "top_k",
  "typical",
  "top_p",
  "min_p",
  "xtc",
  "temperature",
  "mirostat",
)
"""llama-server's default chain (``common_sampler_init``), with mirostat last: see :func:`llama_cpp`."""

GEMMA_ORDER = ("penalties", "top_k", "top_p", "min_p", "fixed_temperature")
VLLM_ORDER = (
  "allowed_tokens",
  "banned_tokens",
  "min_tokens",
  "logit_bias",
  "openai_penalties",
  "fixed_temperature",
  "min_p",
  "top_k",
  "top_p",
)
"""vLLM v1's ``Sampler.forward``: allowed ids, bad words, min_tokens, logit bias, penalties, then
temperature, min-p (an argmax-invariant logits processor), top-k and top-p."""

HF_ORDER = (
  "penalties",
  "banned_tokens",
  "min_tokens",
  "fixed_temperature",
  "top_k",
  "top_p",
  "min_p",
  "typical",
  "epsilon",
  "eta",
)
"""transformers' ``_get_logits_processor``: repetition penalty, suppressed tokens and min_new_tokens
(processors), then the warpers temperature, top-k, top-p, min-p, typical, epsilon, eta."""


def llama_cpp(**overrides) -> Sampler:
  """llama.cpp's (llama-server's) default chain and defaults.

  Order: logit bias → penalties → DRY → top-n-σ → top-k → typical → top-p →
  min-p → XTC → temperature (with dynamic temperature) → mirostat → draw,
  with llama-server's defaults, which are its stages' own: temperature 0.8,
  top-k 40, top-p 0.95, min-p 0.05, and every other stage neutral (penalties
  over the whole 64-token window, DRY with multiplier 0, base 1.75, allowed
  length 2, top-n-σ -1, typical 1, XTC probability 0 and threshold 0.1,
  mirostat 0, tau 5, eta 0.1).

  Mirostat: in llama.cpp ``mirostat`` 1 or 2 replaces the whole chain with
  ``[logit_bias] + temp(temperature) + mirostat``. A per-row setting cannot
  change a compiled chain, so mirostat sits last here and a mirostat row must
  set every stage between logit bias and temperature neutral (penalties,
  DRY, top-n-σ, top-k, typical, top-p, min-p, XTC, dynamic temperature):
  :func:`mirostat_neutral` gives those values, and the config readers apply
  them to mirostat rows. The chain then computes llama.cpp's mirostat chain.

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> sampler = jsample.llama_cpp(temperature=0.0)
    >>> token, state = jax.jit(sampler.pick)(jnp.array([0.0, 1.0, 3.0]), sampler.init(seed=0))
    >>> int(token)
    2
    >>> [stage.name for stage in sampler.stages][:4]
    ['logit_bias', 'penalties', 'dry', 'top_n_sigma']
  """
  return chain_of(LLAMA_CPP_ORDER, {}, overrides)


_MIROSTAT_OFF = (
  "repeat_penalty",
  "frequency_penalty",
  "presence_penalty",
  "dry_multiplier",
  "top_n_sigma",
  "top_k",
  "typical_p",
  "top_p",
  "min_p",
  "xtc_probability",
  "dynatemp_range",
)
"""The settings that, at their neutral values, make :func:`llama_cpp`'s chain llama.cpp's mirostat chain: the one
that turns off each stage between logit bias and temperature (the penalties' three strengths), and dynamic
temperature's range. Their scopes (``penalty_last_n``, ``min_keep``, ...) keep the row's values."""


def mirostat_neutral(settings: dict) -> dict:
  """``settings`` with llama.cpp's mirostat chain where ``mirostat`` is 1 or 2 (one row's settings).

  Examples:
    >>> import jsample
    >>> jsample.mirostat_neutral(dict(mirostat=2, top_k=40))["top_k"]
    0
  """
  if settings.get("mirostat", 0) in (1, 2):
    llama = settings_of(LLAMA_CPP_ORDER)
    return {**settings, **{name: llama[name].neutral for name in _MIROSTAT_OFF}}
  return dict(settings)


def gemma(**overrides) -> Sampler:
  """llama.cpp's order with the stages Gemma's generation defaults use, and those defaults.

  Penalties, top-k, top-p, min-p, temperature: temperature 1.0, top-k 64,
  top-p 0.95 (Gemma's ``generation_config``) and llama.cpp's min-p 0.05. The
  stages that would only sit neutral (DRY, typical, XTC, mirostat, ...) are
  left out: neutral stages still cost passes (see :func:`llama_cpp`).

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jsample
    >>> float(jsample.gemma().init(seed=0).settings["temperature"])
    1.0
  """
  defaults = dict(temperature=1.0, top_k=64, top_p=0.95, min_p=0.05)
  return chain_of(GEMMA_ORDER, defaults, overrides)


def vllm(**overrides) -> Sampler:
  """vLLM's (v1) order and defaults, with OpenAI's penalty scope.

  Order: allowed token ids → banned ids (``bad_words`` as token ids) →
  min_tokens → logit bias → penalties (``scope="openai"``: repetition over
  prompt and output, frequency and presence over output only) → temperature
  → min-p → top-k → top-p → draw. Defaults are ``SamplingParams``': temperature
  1, top-k 0 (off), top-p 1, min-p 0, penalties neutral. vLLM's greedy rows
  (temperature below 1e-5) are temperature 0 here. The arithmetic of each stage
  stays jsample's (llama.cpp's).

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jsample
    >>> [stage.name for stage in jsample.vllm().stages][4:]
    ['penalties', 'temperature', 'min_p', 'top_k', 'top_p']
  """
  defaults = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
  return chain_of(VLLM_ORDER, defaults, overrides)


def hf(**overrides) -> Sampler:
  """Hugging Face transformers' order: temperature *before* truncation.

  Order: repetition penalty → suppressed tokens → min_new_tokens →
  temperature → top-k → top-p → min-p → typical → epsilon → eta → draw, as
  transformers' ``_get_logits_processor`` appends them, so every truncation
  sees the tempered distribution; defaults are its ``GenerationConfig``'s
  (temperature 1.0, top-k 50, the others off). The arithmetic of each stage
  (ties, the crossing token of top-p, the penalties) stays jsample's, i.e.
  llama.cpp's; epsilon and eta are transformers'.

  Args:
    **overrides: setting defaults and static sizes; see the module docstring.

  Examples:
    >>> import jsample
    >>> [stage.name for stage in jsample.hf().stages][3:]
    ['temperature', 'top_k', 'top_p', 'min_p', 'typical', 'epsilon', 'eta']
  """
  defaults = dict(temperature=1.0, top_k=50, top_p=1.0, min_p=0.0)
  return chain_of(HF_ORDER, defaults, overrides)
