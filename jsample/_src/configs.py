"""Config readers: a sampler and one request's per-row settings from other engines' configurations.

Each reader returns a :class:`Config` ``(sampler, settings, extras)``:
``sampler.init(seed=config.extras.get("seed"), **config.settings)`` is the
row's state, and ``extras`` holds what is not a sampler setting (seed, n,
log-probabilities, lengths, stop conditions), under the engine's own names.
A field a reader does not know, a value of the wrong type or out of range
raises a ``ValueError`` that names the field; nothing is silently dropped.
Keyword arguments after the request (``window_size``, ``budget``, ...) go to
the recipe.
"""

import json
import math
import os
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
  """

  sampler: Sampler
  settings: dict
  extras: dict


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
    done[name] = recipes._padded(spec, value) if spec.shape else value
  sampler.init(seed=0, **done)  # raises here, naming the setting, rather than later
  return Config(sampler, done, extras)


# --- OpenAI / vLLM --------------------------------------------------------------

_OPENAI_EXTRAS = (
  "model",
  "prompt",
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "stop",
  "stop_token_ids",
  "stream",
  "stream_options",
  "user",
  "echo",
  "suffix",
  "ignore_eos",
  "include_stop_str_in_output",
  "skip_special_tokens",
  "spaces_between_special_tokens",
)


def _openai_logprobs(field, value):
  # Chat: true/false; completions: an int 0..20 (or null).
  if value is None or isinstance(value, bool):
    return value
  return _number(field, value, 0, 20, integer=True)


def _openai_bias(field, value) -> dict[int, float]:
  if not isinstance(value, Mapping):
    raise ValueError(f"{field}: must be an object of token id strings to biases; got {value!r}")
  out = {}
  for key, bias in value.items():
    if not isinstance(key, str | int) or isinstance(key, bool) or not str(key).isdigit():
      raise ValueError(f"{field}: keys must be token ids (digit strings); got {key!r}")
    out[int(key)] = _number(f"{field}[{key}]", bias, -100, 100)
  return out


def _bad_word_ids(field, value) -> list[int]:
  # vLLM's bad_words are strings (tokenized by the server); jsample takes single token ids only.
  if not isinstance(value, list) or any(isinstance(v, str) for v in value):
    raise ValueError(f"{field}: only single token ids are supported (strings need vLLM's tokenizer); got {value!r}")
  return _ids(field, value)


_OPENAI_FIELDS: dict[str, Callable] = {
  "temperature": lambda f, v: _number(f, v, 0, 2),
  "top_p": lambda f, v: _number(f, v, 0, 1, lo_open=True),
  "top_k": lambda f, v: _number(f, v, -1, integer=True),
  "min_p": lambda f, v: _number(f, v, 0, 1),
  "frequency_penalty": lambda f, v: _number(f, v, -2, 2),
  "presence_penalty": lambda f, v: _number(f, v, -2, 2),
  "repetition_penalty": lambda f, v: _number(f, v, 0, lo_open=True),
  "seed": lambda f, v: _number(f, v, -(2**63), 2**64 - 1, integer=True),
  "logit_bias": _openai_bias,
  "logprobs": _openai_logprobs,
  "top_logprobs": lambda f, v: _number(f, v, 0, 20, integer=True),
  "n": lambda f, v: _number(f, v, 1, integer=True),
  "min_tokens": lambda f, v: _number(f, v, 0, integer=True),
  "allowed_token_ids": lambda f, v: _ids(f, v, allow_empty=False),
  "bad_words": _bad_word_ids,
  **{name: _anything for name in _OPENAI_EXTRAS},
}


def from_openai(request: Mapping, *, eos_token_ids=(), **sizes) -> Config:
  """Reads an OpenAI / vLLM completion request into :func:`jsample.vllm` and one row's settings.

  Sampler fields: ``temperature`` ([0, 2]; 0 is greedy), ``top_p`` ((0, 1]),
  ``top_k`` (-1 or 0: off), ``min_p``, ``frequency_penalty`` and
  ``presence_penalty`` ([-2, 2], over generated tokens), ``repetition_penalty``
  (> 0, over prompt and generated tokens), ``logit_bias`` (``{"id": bias}``,
  bias in [-100, 100]), ``min_tokens`` (bans ``eos_token_ids`` and
  ``stop_token_ids`` until then), ``allowed_token_ids``, ``bad_words`` (single
  token ids only: strings need vLLM's tokenizer and raise).
  Extras (checked where jsample reads them, else passed through): ``seed``,
  ``n``, ``logprobs``, ``top_logprobs`` (0..20), and ``model``, ``prompt``,
  ``messages``, ``max_tokens``, ``max_completion_tokens``, ``stop``,
  ``stop_token_ids``, ``stream``, ``stream_options``, ``user``, ``echo``,
  ``suffix``, ``ignore_eos``, ``include_stop_str_in_output``,
  ``skip_special_tokens``, ``spaces_between_special_tokens``. Anything else
  (``best_of``, ``use_beam_search``, ``response_format``, ``tools``, ...)
  raises.

  Args:
    request: the request body, a mapping.
    eos_token_ids: the model's end-of-sequence ids, banned by ``min_tokens``.
    **sizes: static sizes for :func:`jsample.vllm` (``window_size``, ``budget``...).

  Returns:
    A :class:`Config`.

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> config = jsample.from_openai({"temperature": 0.0, "seed": 7, "logit_bias": {"2": -100}, "max_tokens": 5})
    >>> state = config.sampler.init(seed=config.extras["seed"], **config.settings)
    >>> token, state = jax.jit(config.sampler.pick)(jnp.array([0.0, 1.0, 3.0]), state)
    >>> int(token), config.extras["max_tokens"]
    (1, 5)
  """
  got = _read(request, _OPENAI_FIELDS, "an OpenAI/vLLM request")
  settings: dict[str, Any] = {}
  renames = dict(temperature="temperature", top_p="top_p", min_p="min_p", frequency_penalty="frequency_penalty")
  renames.update(presence_penalty="presence_penalty", repetition_penalty="repeat_penalty")
  for field, name in renames.items():
    if field in got:
      settings[name] = got[field]
  if "top_k" in got:
    settings["top_k"] = max(got["top_k"], 0)  # vLLM: -1 (and 0) mean every token
  bias = got.get("logit_bias", {})
  allowed = got.get("allowed_token_ids", [])
  banned = got.get("bad_words", [])
  stops = _ids("stop_token_ids", got.get("stop_token_ids") or [])
  eos = _ids("eos_token_ids", list(eos_token_ids)) + [i for i in stops if i not in eos_token_ids]
  settings.update(_biases(bias), allowed_token_ids=allowed, banned_token_ids=banned, eos_token_ids=eos)
  if "min_tokens" in got:
    if got["min_tokens"] > 0 and not eos:
      raise ValueError("min_tokens: needs end-of-sequence ids (eos_token_ids=... or stop_token_ids)")
    settings["min_tokens"] = got["min_tokens"]
  sampler = recipes.vllm(
    logit_bias_size=_size(16, len(bias)),
    allowed_tokens_size=_size(64, len(allowed)),
    banned_tokens_size=_size(16, len(banned)),
    eos_size=_size(4, len(eos)),
    **sizes,
  )
  extras = {k: v for k, v in got.items() if k not in _OPENAI_SAMPLING}
  return _finish(sampler, settings, extras)


_OPENAI_SAMPLING = {
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "frequency_penalty",
  "presence_penalty",
  "repetition_penalty",
  "logit_bias",
  "min_tokens",
  "allowed_token_ids",
  "bad_words",
}


# --- transformers' generation_config.json ------------------------------------------

_HF_EXTRAS = (
  "bos_token_id",
  "pad_token_id",
  "decoder_start_token_id",
  "max_length",
  "max_new_tokens",
  "transformers_version",
  "_from_model_config",
  "cache_implementation",
  "use_cache",
  "output_scores",
  "output_logits",
  "output_attentions",
  "output_hidden_states",
  "return_dict_in_generate",
  "stop_strings",
  "early_stopping",
  "max_time",
)


def _unsupported(default) -> Callable:
  """A field jsample cannot honour: accepted only at transformers' default (off)."""

  def check(field, value):
    if value is not None and value != default:
      raise ValueError(f"{field}: not supported by jsample (only {default!r} or null); got {value!r}")
    return value

  return check


def _or_null(check: Callable) -> Callable:
  return lambda f, v: None if v is None else check(f, v)


_HF_FIELDS: dict[str, Callable] = {
  "do_sample": _or_null(_flag),
  "temperature": _or_null(lambda f, v: _number(f, v, 0, lo_open=True)),
  "top_k": _or_null(lambda f, v: _number(f, v, 0, integer=True)),
  "top_p": _or_null(lambda f, v: _number(f, v, 0, 1, lo_open=True)),
  "min_p": _or_null(lambda f, v: _number(f, v, 0, 1)),
  "typical_p": _or_null(lambda f, v: _number(f, v, 0, 1, lo_open=True)),
  "epsilon_cutoff": _or_null(lambda f, v: _number(f, v, 0, 1, hi_open=True)),
  "eta_cutoff": _or_null(lambda f, v: _number(f, v, 0, 1, hi_open=True)),
  "repetition_penalty": _or_null(lambda f, v: _number(f, v, 0, lo_open=True)),
  "suppress_tokens": _or_null(_ids),
  "min_new_tokens": _or_null(lambda f, v: _number(f, v, 0, integer=True)),
  "eos_token_id": _or_null(_one_or_many_ids),
  "num_return_sequences": _or_null(lambda f, v: _number(f, v, 1, integer=True)),
  "num_beams": _unsupported(1),
  "num_beam_groups": _unsupported(1),
  "penalty_alpha": _unsupported(None),
  "no_repeat_ngram_size": _unsupported(0),
  "encoder_no_repeat_ngram_size": _unsupported(0),
  "encoder_repetition_penalty": _unsupported(1.0),
  "bad_words_ids": _unsupported(None),
  "force_words_ids": _unsupported(None),
  "begin_suppress_tokens": _unsupported(None),
  "forced_bos_token_id": _unsupported(None),
  "forced_eos_token_id": _unsupported(None),
  "forced_decoder_ids": _unsupported(None),
  "sequence_bias": _unsupported(None),
  "min_length": _unsupported(0),
  "exponential_decay_length_penalty": _unsupported(None),
  "guidance_scale": _unsupported(None),
  "watermarking_config": _unsupported(None),
  "diversity_penalty": _unsupported(0.0),
  "length_penalty": _unsupported(1.0),  # beam search only; 1.0 is its default
  "renormalize_logits": _unsupported(False),
  "remove_invalid_values": _unsupported(False),
  **{name: _anything for name in _HF_EXTRAS},
}


def from_generation_config(config, **sizes) -> Config:
  """Reads transformers' ``generation_config.json`` (a path or a dict) into :func:`jsample.hf`.

  Sampler fields: ``do_sample`` (false or absent: greedy, temperature 0, as
  transformers' default), ``temperature`` (> 0), ``top_k`` (0: off),
  ``top_p``, ``min_p``, ``typical_p``, ``epsilon_cutoff`` and ``eta_cutoff``
  ([0, 1)), ``repetition_penalty``, ``suppress_tokens`` (banned),
  ``min_new_tokens`` (bans the ``eos_token_id`` ids until then); ``null``
  means transformers' default. Extras: ``eos_token_id`` (as a list),
  ``num_return_sequences`` (also as ``n``), and passed through: ``bos_token_id``,
  ``pad_token_id``, ``decoder_start_token_id``, ``max_length``,
  ``max_new_tokens``, ``transformers_version``, ``_from_model_config``,
  ``cache_implementation``, ``use_cache``, the ``output_*`` and
  ``return_dict_in_generate`` flags, ``stop_strings``, ``early_stopping``,
  ``max_time``. Beam search, n-gram bans, ``bad_words_ids``,
  ``begin_suppress_tokens``, forced tokens, ``sequence_bias``,
  ``min_length``, guidance and watermarking are accepted only at their
  defaults (off); anything else raises.

  Args:
    config: a path to a ``generation_config.json`` or its parsed dict.
    **sizes: static sizes for :func:`jsample.hf`.

  Returns:
    A :class:`Config`.

  Examples:
    >>> import jsample
    >>> fields = {"do_sample": True, "top_k": 64, "top_p": 0.95, "eos_token_id": [1, 106]}
    >>> config = jsample.from_generation_config(fields)
    >>> int(config.settings["top_k"]), config.extras["eos_token_id"]
    (64, [1, 106])
  """
  if isinstance(config, str | os.PathLike):
    with open(config) as f:
      config = json.load(f)
  got = {k: v for k, v in _read(config, _HF_FIELDS, "a generation_config").items() if v is not None}
  settings: dict[str, Any] = {}
  for field, name in dict(temperature="temperature", top_k="top_k", top_p="top_p", min_p="min_p").items():
    if field in got:
      settings[name] = got[field]
  renames = dict(typical_p="typical_p", epsilon_cutoff="epsilon_cutoff", eta_cutoff="eta_cutoff")
  renames.update(repetition_penalty="repeat_penalty")
  for field, name in renames.items():
    if field in got:
      settings[name] = got[field]
  if not got.get("do_sample", False):
    settings["temperature"] = 0.0  # greedy: transformers ignores the warpers
  eos = got.get("eos_token_id", [])
  banned = got.get("suppress_tokens", [])
  settings.update(banned_token_ids=banned, eos_token_ids=eos)
  if got.get("min_new_tokens", 0) > 0:
    if not eos:
      raise ValueError("min_new_tokens: needs eos_token_id")
    settings["min_tokens"] = got["min_new_tokens"]
  sampler = recipes.hf(banned_tokens_size=_size(16, len(banned)), eos_size=_size(4, len(eos)), **sizes)
  extras = {k: v for k, v in got.items() if k not in set(renames) | {"top_k", "top_p", "min_p", "temperature"}}
  extras = {k: v for k, v in extras.items() if k not in ("do_sample", "suppress_tokens", "min_new_tokens")}
  if "num_return_sequences" in got:
    extras["n"] = got["num_return_sequences"]
  return _finish(sampler, settings, extras)


# --- GGUF general.sampling.* ----------------------------------------------------------

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
  # Samplers left out of the sequence still sit in the chain, neutral: llama.cpp would not run them.
  return ("logit_bias", *order, "mirostat")


_LEFT_OUT: dict[str, dict[str, Any]] = dict(
  penalties=dict(penalty_last_n=0),
  dry=dict(dry_multiplier=0.0),
  top_n_sigma=dict(top_n_sigma=-1.0),
  top_k=dict(top_k=0),
  typical=dict(typical_p=1.0),
  top_p=dict(top_p=1.0),
  min_p=dict(min_p=0.0),
  xtc=dict(xtc_probability=0.0),
  temperature=dict(temperature=1.0, dynatemp_range=0.0),
)


def _llama_cpp_sampler(order: tuple[str, ...], settings: dict, sizes: dict) -> tuple[Sampler, dict]:
  """:func:`jsample.llama_cpp`'s defaults on ``order``, and ``settings`` neutral where mirostat is on."""
  defaults = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
  sampler = recipes._recipe(order, defaults, sizes)
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


# --- llama-server /completion ------------------------------------------------------

# llama-server's `samplers` names (common_sampler_types_from_names with allow_alt_names = false: the canonical
# names only, an alternative name is skipped there) and its one-letter string form (common_sampler_types_from_chars).
_SERVER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_SERVER_CHARS = dict(e="penalties", d="dry", s="top_n_sigma", k="top_k", y="typ_p", p="top_p", m="min_p", x="xtc")
_SERVER_CHARS.update(t="temperature")
DRY_DEFAULT_BREAKERS = ("\n", ":", '"', "*")
"""llama-server's default ``dry_sequence_breakers``."""
_BREAKER_BYTES, _BREAKER_TAIL = 40, 20  # llama.cpp's MAX_CHAR_LEN and MAX_SEQ_LEN in llama_sampler_init_dry
_LLAMA_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed

# llama-server's defaults (common_params_sampling), for a field sent for a sampler left out of `samplers`.
_SERVER_DEFAULTS = dict(
  temperature=0.8,
  dynatemp_range=0.0,
  dynatemp_exponent=1.0,
  top_k=40,
  top_p=0.95,
  min_p=0.05,
  typical_p=1.0,
  xtc_probability=0.0,
  xtc_threshold=0.1,
  top_n_sigma=-1.0,
  repeat_penalty=1.0,
  penalty_last_n=64,
  presence_penalty=0.0,
  frequency_penalty=0.0,
  dry_multiplier=0.0,
  dry_base=1.75,
  dry_allowed_length=2,
  dry_penalty_last_n=-1,
)

_SERVER_EXTRAS = (
  "prompt",
  "n_predict",
  "stop",
  "stream",
  "cache_prompt",
  "ignore_eos",
  "n_keep",
  "n_discard",
  "n_indent",
  "id_slot",
  "t_max_prompt_ms",
  "t_max_predict_ms",
  "return_tokens",
  "timings_per_token",
  "post_sampling_probs",
  "response_fields",
  "return_progress",
  "model",
)


def _finite(field, value):
  return _number(field, value, -math.inf, math.inf, lo_open=True, hi_open=True)


def _server_seed(field, value):
  # uint32 in llama.cpp; -1 (JSON's usual spelling) and 0xFFFFFFFF ask for a random seed.
  return _number(field, value, -1, _LLAMA_RANDOM_SEED, integer=True)


def _server_samplers(field, value) -> list[str]:
  if isinstance(value, str):
    names = []
    for c in value:
      if c not in _SERVER_CHARS:
        raise ValueError(
          f"{field}: unknown sampler letter {c!r} (llama-server skips it); known: {sorted(_SERVER_CHARS)}"
        )
      names.append(_SERVER_CHARS[c])
    return names
  if not isinstance(value, list):
    raise ValueError(f"{field}: must be a list of sampler names or a string of letters; got {value!r}")
  for name in value:
    if name not in _SERVER_NAMES:
      why = " (an alternative name: llama-server's samplers array skips it)" if name in _LLAMA_NAMES else ""
      raise ValueError(f"{field}: unknown sampler {name!r}{why}; known: {list(_SERVER_NAMES)}")
  return list(value)


def _server_bias_value(field, value) -> float:
  if value is False:
    return -math.inf
  if isinstance(value, bool):
    raise ValueError(f"{field}: a bias is a number or false (ban); got {value!r}")
  return _number(field, value)


def _server_bias(field, value) -> list[tuple[int | str, float]]:
  """``[[id or text, bias], ...]`` or ``{"id or text": bias}`` as ``(id or text, bias)`` pairs, in order."""
  pairs: list[tuple[int | str, float]] = []
  if isinstance(value, Mapping):
    for key, bias in value.items():
      if not isinstance(key, str):
        raise ValueError(f"{field}: keys must be strings (token ids or text); got {key!r}")
      pairs.append((int(key) if key.isdigit() else key, _server_bias_value(f"{field}[{key!r}]", bias)))
  elif isinstance(value, list):
    for k, pair in enumerate(value):
      if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise ValueError(f"{field}[{k}]: must be a pair [token id or text, bias]; got {pair!r}")
      key, bias = pair
      if isinstance(key, bool) or not isinstance(key, int | str):
        raise ValueError(f"{field}[{k}]: the token must be an id or a text; got {key!r}")
      if isinstance(key, int) and key < 0:
        raise ValueError(f"{field}[{k}]: token ids must be >= 0; got {key!r}")
      pairs.append((key, _server_bias_value(f"{field}[{k}]", bias)))
  else:
    raise ValueError(f"{field}: must be a list of [token, bias] pairs or an object; got {value!r}")
  return pairs


def _server_breakers(field, value) -> list:
  if not isinstance(value, list) or not value:
    raise ValueError(f"{field}: must be a non-empty list of strings or of token-id lists; got {value!r}")
  if all(isinstance(v, str) for v in value):
    return list(value)
  if all(isinstance(v, list | tuple) for v in value):
    return [_ids(f"{field}[{k}]", v, allow_empty=False) for k, v in enumerate(value)]
  raise ValueError(f"{field}: must be all strings or all token-id lists; got {value!r}")


def _not_supported(field, value):
  if value not in (None, "", [], {}):
    raise ValueError(f"{field}: not supported by jsample (constrained decoding); got {value!r}")
  return value


_SERVER_FIELDS: dict[str, Callable] = {
  "temperature": _finite,
  "dynatemp_range": _finite,
  "dynatemp_exponent": _finite,
  "top_k": lambda f, v: _number(f, v, integer=True),
  "top_p": lambda f, v: _number(f, v, 0, 1, lo_open=True),
  "min_p": lambda f, v: _number(f, v, 0, 1),
  "typical_p": lambda f, v: _number(f, v, 0, 1),
  "xtc_probability": lambda f, v: _number(f, v, 0, 1),
  "xtc_threshold": lambda f, v: _number(f, v, 0, 1),
  "min_keep": lambda f, v: _number(f, v, 0, integer=True),
  "top_n_sigma": _finite,
  "repeat_penalty": lambda f, v: _number(f, v, 0, math.inf, lo_open=True, hi_open=True),
  "repeat_last_n": lambda f, v: _number(f, v, -1, integer=True),
  "presence_penalty": _finite,
  "frequency_penalty": _finite,
  "dry_multiplier": lambda f, v: _number(f, v, 0, math.inf, hi_open=True),
  "dry_base": _finite,
  "dry_allowed_length": lambda f, v: _number(f, v, integer=True),
  "dry_penalty_last_n": lambda f, v: _number(f, v, -1, integer=True),
  "dry_sequence_breakers": _server_breakers,
  "mirostat": lambda f, v: _number(f, v, 0, 2, integer=True),
  "mirostat_tau": _finite,
  "mirostat_eta": _finite,
  "seed": _server_seed,
  "n_probs": lambda f, v: _number(f, v, 0, integer=True),
  "logit_bias": _server_bias,
  "samplers": _server_samplers,
  "grammar": _not_supported,
  "json_schema": _not_supported,
  **{name: _anything for name in _SERVER_EXTRAS},
}

# request field -> jsample setting, for the plain numbers
_SERVER_RENAMES = dict(
  temperature="temperature",
  dynatemp_range="dynatemp_range",
  dynatemp_exponent="dynatemp_exponent",
  top_k="top_k",
  top_p="top_p",
  min_p="min_p",
  typical_p="typical_p",
  xtc_probability="xtc_probability",
  xtc_threshold="xtc_threshold",
  min_keep="min_keep",
  top_n_sigma="top_n_sigma",
  repeat_penalty="repeat_penalty",
  repeat_last_n="penalty_last_n",
  presence_penalty="presence_penalty",
  frequency_penalty="frequency_penalty",
  dry_multiplier="dry_multiplier",
  dry_base="dry_base",
  dry_allowed_length="dry_allowed_length",
  dry_penalty_last_n="dry_penalty_last_n",
  mirostat="mirostat",
  mirostat_tau="mirostat_tau",
  mirostat_eta="mirostat_eta",
)


def _encode(tokenizer, text: str) -> list[int]:
  """llama.cpp's ``tokenize(text, add_special = false, parse_special = false)`` through ``tokenizer.encode``.

  jsample's :class:`~jsample.models.tokenizer.Tokenizer` is called with ``bos=False``, a Hugging Face
  tokenizer with ``add_special_tokens=False``; any other ``encode(text)`` must add no special tokens itself.
  """
  import inspect

  params: Mapping[str, Any]
  try:
    params = inspect.signature(tokenizer.encode).parameters
  except (TypeError, ValueError):
    params = {}
  if "bos" in params:
    ids = tokenizer.encode(text, bos=False)
  elif "add_special_tokens" in params:
    ids = tokenizer.encode(text, add_special_tokens=False)
  else:
    ids = tokenizer.encode(text)
  return [int(i) for i in ids]


def _token_pieces(tokenizer) -> list[bytes] | None:
  """Each token's bytes as llama.cpp's ``detokenize({t}, special = true)`` gives them (SPM vocabularies).

  Needs ``tokenizer.tokens`` (texts) and ``tokenizer.types`` (GGUF token types), as jsample's Tokenizer has;
  ``None`` for a tokenizer without them. Control, unknown and user-defined tokens give their text as is,
  normal tokens their text with ``▁`` as a space, byte tokens ``<0xXX>`` their byte, unused tokens nothing.
  """
  texts, types = getattr(tokenizer, "tokens", None), getattr(tokenizer, "types", None)
  if texts is None or types is None:
    return None
  from jsample.models.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED

  pieces = []
  for text, kind in zip(texts, np.asarray(types).tolist(), strict=True):
    if kind in (CONTROL, UNKNOWN, USER_DEFINED):
      pieces.append(text.encode("utf-8"))
    elif kind == NORMAL:
      pieces.append(text.replace("\u2581", " ").encode("utf-8"))
    elif kind == BYTE:
      pieces.append(bytes([int(text[3:5], 16)]))
    else:
      pieces.append(b"")
  return pieces


def dry_breaker_sequences(breakers, tokenizer) -> list[list[int]]:
  """llama.cpp's DRY sequence breakers (strings) as token-id sequences ``[head, *tail]``.

  As ``get_overlapping_token_sequences`` in ``llama_sampler_init_dry``: each breaker is cut to 40 bytes;
  every token whose text contains it is a single-token breaker ``[t]``; every token whose text *ends* with a
  proper prefix of it (starting at any occurrence of its first byte) is a head, followed by the tokenization
  of the rest of the breaker (at most 20 tokens). Needs a vocabulary: ``tokenizer.tokens`` and
  ``tokenizer.types`` (jsample's Tokenizer). With only ``tokenizer.encode``, each breaker gives one sequence,
  its own tokenization (its first token as head): tokens that merely contain or end with part of a breaker
  (``"\\n\\n"``, ``"):"``) are then not breakers, as they are in llama.cpp.

  Args:
    breakers: strings, llama-server's ``dry_sequence_breakers``.
    tokenizer: an object with ``encode(text) -> list[int]``, ideally with ``tokens`` and ``types``.

  Returns:
    Deduplicated ``[head, *tail]`` id lists, in vocabulary order per breaker.

  Examples:
    >>> from jsample.models.tokenizer import Tokenizer, NORMAL, USER_DEFINED
    >>> types = [NORMAL, USER_DEFINED, NORMAL, NORMAL]
    >>> tok = Tokenizer(["a", "\\n", "a\\n", "b"], [-1, 0, -2, -1], types, bos=0, eos=0)
    >>> dry_breaker_sequences(["\\n"], tok)
    [[1], [2]]
  """
  out: list[list[int]] = []
  seen: set[tuple[int, ...]] = set()

  def add(seq):
    if tuple(seq) not in seen:
      seen.add(tuple(seq))
      out.append(list(seq))

  pieces = _token_pieces(tokenizer)
  tails: dict[bytes, list[int]] = {}
  for text in breakers:
    s = text.encode("utf-8")[:_BREAKER_BYTES]
    if not s:
      continue  # llama.cpp skips an empty breaker (with a warning)
    if pieces is None:
      ids = _encode(tokenizer, s.decode("utf-8", errors="replace"))[: _BREAKER_TAIL + 1]
      if ids:
        add(ids)
      continue
    first = s[:1]
    for t, w in enumerate(pieces):
      if s in w:
        add([t])
        continue
      pos = w.find(first)
      while pos >= 0:
        overlap = len(w) - pos
        if w[pos:] == s[:overlap]:
          rest = s[overlap:]
          if rest not in tails:
            tails[rest] = _encode(tokenizer, rest.decode("utf-8", errors="replace"))[:_BREAKER_TAIL]
          add([t, *tails[rest]])
        pos = w.find(first, pos + 1)
  return out


# The token texts llama.cpp's vocabulary loader adds to the end-of-generation ids, beside EOS (llama-vocab.cpp).
_EOG_TEXTS = frozenset(
  (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
  )
)


def end_of_generation_ids(tokenizer) -> list[int]:
  """The ids that end generation, as llama.cpp's ``vocab.get_eog_tokens()`` collects them.

  EOS (``tokenizer.eos``, or a Hugging Face tokenizer's ``eos_token_id``), and where the tokenizer lists its
  tokens' texts (``tokenizer.tokens``), every token named as llama.cpp names end-of-turn tokens
  (``<end_of_turn>``, ``<|eot_id|>``, ``<|im_end|>``, ...).

  Examples:
    >>> from jsample.models.tokenizer import Tokenizer, CONTROL, NORMAL
    >>> tok = Tokenizer(["<eos>", "<bos>", "a", "<end_of_turn>"], [0, 0, -1, 0], [CONTROL, CONTROL, NORMAL, CONTROL],
    ...                 bos=1, eos=0)
    >>> end_of_generation_ids(tok)
    [0, 3]
  """
  eos = getattr(tokenizer, "eos", getattr(tokenizer, "eos_token_id", None))
  found = set() if eos is None else {int(e) for e in np.atleast_1d(eos)}
  texts = getattr(tokenizer, "tokens", None)
  if texts is not None:
    found |= {i for i, text in enumerate(texts) if text in _EOG_TEXTS}
  return sorted(found)


def _server_logit_bias(pairs, tokenizer) -> tuple[list[int], list[float]]:
  ids: list[int] = []
  values: list[float] = []
  for key, bias in pairs:
    if isinstance(key, str):
      if tokenizer is None:
        raise ValueError(f"logit_bias: the token text {key!r} needs tokenizer=... (an object with encode)")
      pieces = _encode(tokenizer, key)
    else:
      pieces = [key]
    ids += pieces
    values += [bias] * len(pieces)
  return ids, values


def from_llama_server(request: Mapping, *, tokenizer=None, **sizes) -> Config:
  """Reads a llama-server ``/completion`` request into :func:`jsample.llama_cpp` and one row's settings.

  Sampler fields (llama-server's names): ``temperature`` (<= 0: greedy), ``dynatemp_range``,
  ``dynatemp_exponent``, ``top_k`` (<= 0: off), ``top_p`` ((0, 1]), ``min_p``, ``typical_p``,
  ``xtc_probability``, ``xtc_threshold`` ([0, 1]), ``min_keep``, ``top_n_sigma``, ``repeat_penalty`` (> 0),
  ``repeat_last_n`` (-1: the whole window), ``presence_penalty``, ``frequency_penalty``, ``dry_multiplier``,
  ``dry_base`` (below 1: llama-server's 1.75, as the server replaces it), ``dry_allowed_length``,
  ``dry_penalty_last_n`` (-1: the whole window), ``dry_sequence_breakers`` (strings, turned into token
  sequences with ``tokenizer`` by :func:`dry_breaker_sequences`, or lists of token ids, used as they are),
  ``mirostat`` (0, 1, 2; a mirostat row gets :func:`jsample.mirostat_neutral` settings and llama.cpp's full
  chain order, since llama.cpp ignores ``samplers`` there), ``mirostat_tau``, ``mirostat_eta``,
  ``logit_bias`` (``[[id or text, bias], ...]`` or ``{"id or text": bias}``; ``false`` bans; a text is
  tokenized and each of its tokens gets the bias; duplicates add up, as in llama.cpp) and ``samplers``
  (canonical names, or the letters ``edskypmxt``: the stage order; stages left out are left out of the chain,
  and a field of a left-out stage must be at llama-server's default or neutral, else it raises).
  With ``dry_multiplier`` > 0 and no ``dry_sequence_breakers``, llama-server's default
  ``["\\n", ":", "\\"", "*"]`` is used, which needs ``tokenizer``.

  Extras: ``seed`` (``None`` for llama.cpp's random seed, -1 or 0xFFFFFFFF), ``n_probs`` (pass it as
  ``Sampler.pick_with_info(..., top_logprobs=n)``), and passed through: ``prompt``, ``n_predict``, ``stop``,
  ``stream``, ``cache_prompt``, ``ignore_eos`` (also applied, as llama-server does: a -inf bias on every id of
  :func:`end_of_generation_ids`, which needs ``tokenizer``), ``n_keep``, ``n_discard``, ``n_indent``, ``id_slot``,
  ``t_max_prompt_ms``, ``t_max_predict_ms``, ``return_tokens``, ``timings_per_token``,
  ``post_sampling_probs``, ``response_fields``, ``return_progress``, ``model``. ``grammar`` and
  ``json_schema`` are accepted only empty. Anything else raises, naming the field.

  Args:
    request: the request body, a mapping.
    tokenizer: for text in ``logit_bias``, string ``dry_sequence_breakers`` and ``ignore_eos``: an object with
      ``encode(text) -> list[int]`` (jsample's Tokenizer, called with ``bos=False``; a Hugging Face
      tokenizer, with ``add_special_tokens=False``). For the breakers, llama.cpp's exact sequences need
      the vocabulary too (``tokens`` and ``types``, as jsample's Tokenizer has); see
      :func:`dry_breaker_sequences`.
    **sizes: static sizes for :func:`jsample.llama_cpp` (``window_size``, ``budget``, ...).

  Returns:
    A :class:`Config`.

  Examples:
    >>> import jax, jax.numpy as jnp, jsample
    >>> request = {"temperature": 0.0, "seed": 7, "logit_bias": [[2, False]], "samplers": ["top_k", "temperature"]}
    >>> config = jsample.from_llama_server(request)
    >>> state = config.sampler.init(seed=config.extras["seed"], **config.settings)
    >>> token, state = jax.jit(config.sampler.pick)(jnp.array([0.0, 1.0, 3.0]), state)
    >>> int(token), [stage.name for stage in config.sampler.stages]
    (1, ['logit_bias', 'top_k', 'temperature', 'mirostat'])
  """
  got = _read(request, _SERVER_FIELDS, "a llama-server request")
  settings: dict[str, Any] = {name: got[field] for field, name in _SERVER_RENAMES.items() if field in got}
  if settings.get("dry_base", 1.75) < 1.0:
    settings["dry_base"] = 1.75  # llama-server: "if (dry_base < 1.0f) dry_base = defaults.dry_base"
  if "top_k" in settings:
    settings["top_k"] = max(settings["top_k"], 0)
  ids, values = _server_logit_bias(got.get("logit_bias", []), tokenizer)
  if got.get("ignore_eos", False):  # llama-server bans every end-of-generation token with a -inf bias
    eog = [] if tokenizer is None else end_of_generation_ids(tokenizer)
    if not eog:
      raise ValueError("ignore_eos: needs tokenizer=... with an eos (or eos_token_id) to know which ids to ban")
    ids, values = ids + eog, values + [-math.inf] * len(eog)
  settings.update(logit_bias_ids=ids, logit_bias_values=values)

  mirostat = got.get("mirostat", 0) in (1, 2)
  order = _order("samplers", got["samplers"]) if "samplers" in got and not mirostat else recipes.LLAMA_CPP_ORDER
  breakers = got.get("dry_sequence_breakers")
  dry_runs = "dry" in order and not mirostat and settings.get("dry_multiplier", 0.0) > 0
  if not dry_runs and breakers in (None, list(DRY_DEFAULT_BREAKERS)):
    breakers = None  # llama.cpp never builds them: no tokenizer needed
  elif breakers is None:
    breakers = list(DRY_DEFAULT_BREAKERS)
  if breakers is not None and isinstance(breakers[0], str):
    if tokenizer is None:
      default = " (llama-server's default, as dry_multiplier > 0)" if "dry_sequence_breakers" not in got else ""
      raise ValueError(
        f"dry_sequence_breakers: strings{default} need tokenizer=... (an object with encode), "
        "or give the breakers as token-id lists"
      )
    breakers = dry_breaker_sequences(breakers, tokenizer)
  if breakers is not None:
    table = np.full((len(breakers), max(len(b) for b in breakers)), -1, np.int32)
    for row, b in zip(table, breakers, strict=True):
      row[: len(b)] = b
    settings["dry_sequence_breakers"] = table

  sizes = dict(sizes)
  longest = max((len(b) for b in breakers or []), default=0)
  for key, at_least, need in (
    ("logit_bias_size", 16, len(ids)),
    ("max_breakers", 8, len(breakers or [])),
    ("max_breaker_length", 4, longest),
  ):
    sizes[key] = _size(sizes.get(key, at_least), need)
  if "dry" not in order:
    sizes.pop("max_breakers"), sizes.pop("max_breaker_length")
  # A field of a sampler left out of `samplers` is accepted at its default or neutral value (llama.cpp never
  # reads it); any other value raises in _llama_cpp_sampler.
  known = {s.name for name in order for s in recipes._STAGES[name][0]().settings}
  neutral: dict[str, Any] = {k: v for stage in _LEFT_OUT.values() for k, v in dict(stage).items()}
  for name in list(settings):
    if name not in known:
      value = settings[name]
      if isinstance(value, list | np.ndarray) and not len(value):
        del settings[name]
      elif not isinstance(value, list | np.ndarray) and value in (_SERVER_DEFAULTS.get(name), neutral.get(name)):
        del settings[name]
  sampler, settings = _llama_cpp_sampler(order, settings, sizes)
  extras = {k: v for k, v in got.items() if k in _SERVER_EXTRAS or k in ("n_probs",)}
  if "seed" in got:
    extras["seed"] = None if got["seed"] in (-1, _LLAMA_RANDOM_SEED) else got["seed"]
  return _finish(sampler, settings, extras)
