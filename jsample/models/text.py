"""Gemma 3 270M with its tokenizer: text in, logits out."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jsample.models import gemma3
from jsample.models.tokenizer import Tokenizer


class TextModel(NamedTuple):
  """A model and the tokenizer of its vocabulary.

  Attributes:
    model: the :class:`jsample.models.gemma3.Gemma3` (parameters on the default device).
    tokenizer: its :class:`jsample.models.tokenizer.Tokenizer`.
  """

  model: gemma3.Gemma3
  tokenizer: Tokenizer


@functools.cache
def gemma3_270m() -> TextModel:
  """Gemma 3 270M and its tokenizer, loaded once per process (from the cache after the first run).

  Raises:
    jsample.models.weights.MissingExtra: the ``gemma`` extra is not installed.
  """
  model, extras = gemma3.load()
  meta, vocab = extras["metadata"], extras["vocabulary"]
  tokenizer = Tokenizer(
    vocab.tokens,
    vocab.scores,
    vocab.types,
    bos=int(meta["tokenizer.ggml.bos_token_id"]),
    eos=int(meta["tokenizer.ggml.eos_token_id"]),
  )
  return TextModel(model, tokenizer)


def pad(prompts: list[list[int]], multiple: int = 8) -> tuple[np.ndarray, np.ndarray]:
  """Token lists as ``[B, L]`` int32 right-padded with 0 to a multiple of ``multiple``, and their lengths ``[B]``.

  Examples:
    >>> tokens, lengths = pad([[2, 5, 6], [2]], multiple=4)
    >>> tokens.tolist(), lengths.tolist()
    ([[2, 5, 6, 0], [2, 0, 0, 0]], [3, 1])
  """
  lengths = np.array([len(p) for p in prompts], np.int32)
  width = -(-int(lengths.max()) // multiple) * multiple
  tokens = np.zeros((len(prompts), width), np.int32)
  for row, ids in zip(tokens, prompts, strict=True):
    row[: len(ids)] = ids
  return tokens, lengths


@jax.jit
def _last_logits(model: gemma3.Gemma3, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  x, _ = gemma3.sequence(model, tokens)
  return gemma3.logits_of(model, gemma3.last(x, lengths))


def next_token_logits(prompts: list[str]) -> np.ndarray:
  """Gemma 3 270M's next-token logits after each prompt: real rows for benchmarks and notebooks.

  Each prompt is tokenized with BOS first (an empty prompt is BOS alone) and run in one batched call.

  Args:
    prompts: ``B`` texts.

  Returns:
    ``[B, V]`` float32 NumPy logits, ``V = 262144``.

  Raises:
    jsample.models.weights.MissingExtra: the ``gemma`` extra is not installed.

  Example (needs the ``gemma`` extra; the first call in a fresh cache takes about 25 s)::

    from jsample.models import next_token_logits
    rows = next_token_logits(["The capital of France is", "def fibonacci(n):"])  # [2, 262144]
  """
  if isinstance(prompts, str):
    raise ValueError("prompts: give a list of texts, not one text")
  if not prompts:
    raise ValueError("prompts: give at least one text")
  text = gemma3_270m()
  tokens, lengths = pad([text.tokenizer.encode(p) for p in prompts])
  return np.asarray(_last_logits(text.model, jnp.asarray(tokens), jnp.asarray(lengths)))
