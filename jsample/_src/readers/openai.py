"""The OpenAI (and vLLM) request reader."""

from collections.abc import Callable, Mapping
from typing import Any

from jsample._src import recipes
from jsample._src.readers.fields import Config, _anything, _biases, _finish, _ids, _number, _read, _size

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
