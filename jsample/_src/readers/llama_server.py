"""The llama-server ``/completion`` request reader."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jsample._src import recipes
from jsample._src.readers.fields import Config, _anything, _finish, _ids, _number, _read, _size
from jsample._src.readers.gguf import _LLAMA_NAMES, _llama_cpp_sampler, _order
from jsample._src.readers.llama_vocab import _encode, dry_breaker_sequences, end_of_generation_ids

# llama-server's `samplers` names (common_sampler_types_from_names with allow_alt_names = false: the canonical
# names only, an alternative name is skipped there) and its one-letter string form (common_sampler_types_from_chars).
_SERVER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_SERVER_CHARS = dict(e="penalties", d="dry", s="top_n_sigma", k="top_k", y="typ_p", p="top_p", m="min_p", x="xtc")
_SERVER_CHARS.update(t="temperature")
DRY_DEFAULT_BREAKERS = ("\n", ":", '"', "*")
"""llama-server's default ``dry_sequence_breakers``."""
_LLAMA_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed

# llama-server's defaults (common_params_sampling) are jsample.llama_cpp's, its stages' own, bar one: repeat_last_n
# counts 64 tokens, where the recipe's -1 is the whole window (64 tokens at the default window_size).
_SERVER_DEFAULTS_UNLIKE_THE_RECIPE = dict(penalty_last_n=64)

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
  llama = recipes.settings_of(recipes.LLAMA_CPP_ORDER)
  base = llama["dry_base"].default
  if settings.get("dry_base", base) < 1.0:
    settings["dry_base"] = base  # llama-server: "if (dry_base < 1.0f) dry_base = defaults.dry_base"
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
  # A field of a sampler left out of `samplers` is accepted at llama-server's default or at its neutral value
  # (llama.cpp never reads it); any other value raises in _llama_cpp_sampler.
  known = recipes.settings_of(order)
  for name in list(settings):
    if name not in known:
      value = settings[name]
      if isinstance(value, list | np.ndarray):
        if not len(value):
          del settings[name]
      elif value in (_SERVER_DEFAULTS_UNLIKE_THE_RECIPE.get(name, llama[name].default), llama[name].neutral):
        del settings[name]
  sampler, settings = _llama_cpp_sampler(order, settings, sizes)
  extras = {k: v for k, v in got.items() if k in _SERVER_EXTRAS or k in ("n_probs",)}
  if "seed" in got:
    extras["seed"] = None if got["seed"] in (-1, _LLAMA_RANDOM_SEED) else got["seed"]
  return _finish(sampler, settings, extras)
