"""llama.cpp's vocabulary work: DRY's sequence breakers as token ids, and the end-of-generation ids."""

from collections.abc import Mapping
from typing import Any

import numpy as np

_BREAKER_BYTES, _BREAKER_TAIL = 40, 20  # llama.cpp's MAX_CHAR_LEN and MAX_SEQ_LEN in llama_sampler_init_dry
# GGUF's token types (tokenizer.ggml.token_type), as llama.cpp's llama_token_type numbers them.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


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
