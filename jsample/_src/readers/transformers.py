"""The transformers ``generation_config.json`` reader."""

import json
import os
from collections.abc import Callable
from typing import Any

from jsample._src import recipes
from jsample._src.readers.fields import Config, _anything, _finish, _flag, _ids, _number, _one_or_many_ids, _read, _size

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
