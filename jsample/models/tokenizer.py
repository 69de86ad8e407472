"""A SentencePiece-style tokenizer built from a GGUF vocabulary, as llama.cpp's ``llama`` (SPM) tokenizer runs it.

Encoding: the text is first split around user-defined tokens (``\\n``, runs of spaces or tabs, HTML tags), longest
token first; each remaining piece has its spaces replaced by ``▁`` and is split into characters, and adjacent
symbols merge, best score first (the leftmost pair on a tie), while their concatenation is a token. A symbol left
that is not a token falls back to the merges that built it and, below those, to one ``<0xXX>`` token per byte.

Decoding maps ``▁`` back to a space and byte tokens to their byte, and drops control tokens (``<bos>``, ``<eos>``);
:meth:`Tokenizer.stream` does so token by token and releases only whole UTF-8 characters.
"""

import codecs
import heapq
from collections.abc import Iterable

import numpy as np

# GGUF's token types, defined beside the vocabulary readers and re-exported here for the tokenizer's users.
from jsample._src.readers.llama_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED  # noqa: F401

SPACE = "\u2581"  # ▁


class Tokenizer:
  """Text <-> token ids for one vocabulary.

  Args:
    tokens: ``V`` token texts.
    scores: ``[V]`` merge scores.
    types: ``[V]`` token types (see :mod:`jsample.models.weights`).
    bos: id added before every encoded text.
    eos: id that ends generation.

  Examples:
    >>> tok = Tokenizer(["<eos>", "<bos>", "▁", "a", "b", "▁a", "ab"], [0, 0, -3, -1, -1, -2, -0.5],
    ...                 [CONTROL, CONTROL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL], bos=1, eos=0)
    >>> tok.encode("ab a")
    [1, 6, 5]
    >>> tok.decode([1, 6, 5, 0])
    'ab a'
  """

  def __init__(self, tokens: list[str], scores, types, *, bos: int, eos: int):
    self.tokens = list(tokens)
    self.scores = np.asarray(scores, np.float32)
    self.types = np.asarray(types, np.int32)
    self.bos, self.eos = bos, eos
    self.ids: dict[str, int] = {}
    for i, text in enumerate(self.tokens):
      self.ids.setdefault(text, int(i))
    self.byte_ids = {}
    for b in np.flatnonzero(self.types == BYTE):
      self.byte_ids[int(self.tokens[b][3:5], 16)] = int(b)
    # llama.cpp tries the longest user-defined token first; control tokens are only parsed on request.
    user = [i for i in np.flatnonzero(self.types == USER_DEFINED) if self.tokens[i]]
    self.user_defined = sorted(user, key=lambda i: -len(self.tokens[i]))
    self._pieces = [self._piece(i) for i in range(len(self.tokens))]

  def _piece(self, i: int) -> bytes:
    kind = self.types[i]
    if kind == BYTE:
      return bytes([int(self.tokens[i][3:5], 16)])
    if kind in (CONTROL, UNKNOWN, UNUSED):
      return b""
    return self.tokens[i].replace(SPACE, " ").encode("utf-8")

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  def encode(self, text: str, *, bos: bool = True) -> list[int]:
    """Token ids of ``text``, with BOS first unless ``bos=False``.

    Examples:
      >>> tok = Tokenizer(["<bos>", "▁", "x"], [0, -1, -1], [CONTROL, NORMAL, NORMAL], bos=0, eos=0)
      >>> tok.encode("")
      [0]
    """
    ids = [self.bos] if bos else []
    for piece, special in self._split(text):
      ids += [special] if special is not None else self._spm(piece.replace(" ", SPACE))
    return ids

  def _split(self, text: str) -> list[tuple[str, int | None]]:
    """``text`` as ``(piece, None)`` runs and ``("", id)`` user-defined tokens, in order."""
    parts: list[tuple[str, int | None]] = [(text, None)] if text else []
    for token in self.user_defined:
      needle = self.tokens[token]
      split = []
      for piece, special in parts:
        if special is not None or needle not in piece:
          split.append((piece, special))
          continue
        chunks = piece.split(needle)
        for k, chunk in enumerate(chunks):
          if k:
            split.append(("", int(token)))
          if chunk:
            split.append((chunk, None))
      parts = split
    return parts

  def _spm(self, text: str) -> list[int]:
    """SentencePiece's merge-by-score over the characters of ``text`` (spaces already ``▁``)."""
    symbols = list(text)
    if not symbols:
      return []
    prev = list(range(-1, len(symbols) - 1))
    nxt = list(range(1, len(symbols))) + [-1]
    merged_from: dict[str, tuple[str, str]] = {}
    heap: list[tuple[float, int, str]] = []

    def offer(left: int, right: int) -> None:
      if left < 0 or right < 0:
        return
      joined = symbols[left] + symbols[right]
      token = self.ids.get(joined)
      if token is None:
        return
      heapq.heappush(heap, (-float(self.scores[token]), left, joined))
      merged_from.setdefault(joined, (symbols[left], symbols[right]))

    for i in range(len(symbols) - 1):
      offer(i, i + 1)
    while heap:
      _, left, joined = heapq.heappop(heap)
      right = nxt[left]
      # Stale entry: one side has merged since it was offered.
      if right < 0 or not symbols[left] or symbols[left] + symbols[right] != joined:
        continue
      symbols[left], symbols[right] = joined, ""
      nxt[left] = nxt[right]
      if nxt[right] >= 0:
        prev[nxt[right]] = left
      offer(prev[left], left)
      offer(left, nxt[left])

    ids: list[int] = []
    i = 0
    while i >= 0:
      self._resegment(symbols[i], merged_from, ids)
      i = nxt[i]
    return ids

  def _resegment(self, text: str, merged_from: dict[str, tuple[str, str]], out: list[int]) -> None:
    token = self.ids.get(text)
    if token is not None:
      out.append(token)
    elif text in merged_from:
      for half in merged_from[text]:
        self._resegment(half, merged_from, out)
    else:
      out += [self.byte_ids[b] for b in text.encode("utf-8")]

  def decode(self, ids: Iterable[int]) -> str:
    """The text of ``ids``; control tokens vanish, invalid UTF-8 becomes U+FFFD."""
    return b"".join(self._pieces[int(i)] for i in ids).decode("utf-8", errors="replace")

  def stream(self) -> "Detokenizer":
    """A :class:`Detokenizer` that turns ids into text one at a time."""
    return Detokenizer(self._pieces)


class Detokenizer:
  """Streaming decode: :meth:`push` returns the text that a token completes.

  A character split over byte tokens appears once its last byte arrives, so printed text is always valid UTF-8.

  Examples:
    >>> tok = Tokenizer(["<0xC3>", "<0xA9>", "▁x"], [0, 0, -1], [BYTE, BYTE, NORMAL], bos=2, eos=2)
    >>> stream = tok.stream()
    >>> [stream.push(i) for i in (2, 0, 1)]
    [' x', '', 'é']
  """

  def __init__(self, pieces: list[bytes]):
    self._pieces = pieces
    self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def push(self, token: int) -> str:
    return self._utf8.decode(self._pieces[int(token)])

  def flush(self) -> str:
    """Whatever is left (an incomplete character becomes U+FFFD)."""
    return self._utf8.decode(b"", final=True)
