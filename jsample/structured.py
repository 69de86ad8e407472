"""Structured output: an XGrammar grammar decides which tokens are allowed, jsample draws among them.

Needs the optional extra ``structured`` (``pip install "jsample[structured]"``, which installs XGrammar); without
it, :func:`compile_json_schema`, :func:`compile_regex` and :func:`tokenizer_info` raise :class:`MissingExtra` naming
that command. The core of jsample never imports this module.

A :class:`Constraint` holds one XGrammar ``GrammarMatcher`` per row. Each step, :meth:`Constraint.mask` gives the
matchers' next-token bitmasks as a packed mask ``[B, M]`` (XGrammar's int32 bitmask is jsample's packed layout: bit
``j % 32`` of word ``j // 32`` allows token ``j``, so the words pass through unchanged), the jitted ``pick`` draws
with it, and :meth:`Constraint.advance` feeds the drawn tokens to the matchers. The matcher runs on the host, so a
step costs one round trip, the one it needs: the tokens come to the host and the mask goes back. The logits never
leave the device.

Example (needs the ``gemma`` and ``structured`` extras)::

  import jax, jsample
  from jsample import structured
  from jsample.models import gemma3_270m

  tokenizer = gemma3_270m().tokenizer
  grammar = structured.compile_json_schema('{"type": "object", ...}', tokenizer)
  constraint = structured.Constraint(grammar, batch=B)
  step = jax.jit(sampler.pick)
  while not constraint.done.all():
    logits = model(tokens)                                         # [B, V]
    tokens, state = step(logits, state, mask=constraint.mask())    # only tokens the grammar allows
    constraint.advance(tokens)

``jsample generate --json-schema FILE`` and ``--regex PATTERN`` run this loop (``jsample.models.generate``).
"""

import importlib
import re
from typing import Any

import numpy as np

INSTALL = 'pip install "jsample[structured]"'
# SentencePiece token types (GGUF's tokenizer.ggml.token_type) that stand for text; the others (control, unknown,
# unused) are given to XGrammar as empty strings, which it treats as special tokens a grammar never allows.
_TEXT_TYPES = (1, 4, 6)  # normal, user-defined, byte


class MissingExtra(ImportError):
  """XGrammar, the ``structured`` extra, is not installed.

  Its message names the install command.

  Examples:
    >>> issubclass(MissingExtra, ImportError)
    True
  """


def xgrammar() -> Any:
  """The ``xgrammar`` module; :class:`MissingExtra`, naming the install command, where it is not installed.

  Examples:
    >>> xgrammar().__name__
    'xgrammar'
  """
  try:
    return importlib.import_module("xgrammar")
  except ImportError as error:
    raise MissingExtra(f"structured output needs XGrammar; install the extra: {INSTALL}") from error


def tokenizer_info(tokenizer) -> Any:
  """An ``xgrammar.TokenizerInfo`` for a SentencePiece vocabulary with byte fallback, such as Gemma's.

  Args:
    tokenizer: a :class:`jsample.models.Tokenizer`, or anything with ``tokens`` (``V`` texts, ``▁`` for a space,
      ``<0xXX>`` for a byte), ``types`` (``[V]`` GGUF token types) and ``eos`` (the stop token's id).

  Returns:
    The ``TokenizerInfo``: control, unknown and unused tokens are special (never allowed by a grammar), ``eos`` is
    the stop token a completed grammar allows.

  Examples:
    >>> from types import SimpleNamespace
    >>> vocab = SimpleNamespace(tokens=["<eos>", "a", "b"], types=[3, 1, 1], eos=0)  # 3: a control token
    >>> info = tokenizer_info(vocab)
    >>> info.vocab_size, info.stop_token_ids
    (3, [0])
  """
  xgr = xgrammar()
  text = np.isin(np.asarray(tokenizer.types), _TEXT_TYPES)
  vocab = [token if keep else "" for token, keep in zip(tokenizer.tokens, text, strict=True)]
  return xgr.TokenizerInfo(
    vocab, xgr.VocabType.BYTE_FALLBACK, vocab_size=len(vocab), stop_token_ids=[int(tokenizer.eos)]
  )


def _compiler(tokenizer) -> Any:
  # The vocabulary's TokenizerInfo takes a moment to build; the latest tokenizer's compiler (and its cache) is kept.
  if not _latest or _latest[0] is not tokenizer:
    _latest[:] = [tokenizer, xgrammar().GrammarCompiler(tokenizer_info(tokenizer), max_threads=2)]
  return _latest[1]


_latest: list[Any] = []


def _readable(error: RuntimeError) -> str:
  """XGrammar's message without its C++ prefix (``[01:12:31] /project/cpp/x.cc:94: ``)."""
  return re.sub(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?", "", str(error)).strip()


def compile_json_schema(schema: str | dict, tokenizer, *, any_whitespace: bool = False) -> Any:
  """A JSON schema compiled against ``tokenizer``'s vocabulary, for :class:`Constraint`.

  Args:
    schema: the schema, as JSON text or a dict.
    tokenizer: see :func:`tokenizer_info`.
    any_whitespace: allow any whitespace between JSON's tokens; off by default, so the output is compact JSON
      (one space after ``:`` and ``,``) and a small model cannot wander off into blank lines.

  Returns:
    An ``xgrammar.CompiledGrammar``.

  Raises:
    ValueError: the schema is not JSON, or uses what XGrammar does not support.
    MissingExtra: XGrammar is not installed.

  Examples:
    >>> from types import SimpleNamespace
    >>> vocab = SimpleNamespace(tokens=["<eos>", "1", "2", "x"], types=[3, 1, 1, 1], eos=0)
    >>> constraint = Constraint(compile_json_schema({"type": "integer", "maximum": 99}, vocab))
    >>> constraint.advance([1]); constraint.advance([2]); constraint.advance([0]); constraint.done.tolist()
    [True]
  """
  try:
    return _compiler(tokenizer).compile_json_schema(schema, any_whitespace=any_whitespace)
  except RuntimeError as error:
    raise ValueError(f"json schema: {_readable(error)}") from None


def compile_regex(pattern: str, tokenizer) -> Any:
  """A regular expression compiled against ``tokenizer``'s vocabulary, for :class:`Constraint`; the whole output
  must match it.

  Raises:
    ValueError: XGrammar cannot parse the pattern.
    MissingExtra: XGrammar is not installed.

  Examples:
    >>> from types import SimpleNamespace
    >>> vocab = SimpleNamespace(tokens=["<eos>", "a", "b"], types=[3, 1, 1], eos=0)  # 3: a control token
    >>> Constraint(compile_regex("a+b", vocab)).mask().shape
    (1, 1)
  """
  try:
    return _compiler(tokenizer).compile_regex(pattern)
  except RuntimeError as error:
    raise ValueError(f"regex: {_readable(error)}") from None


class Constraint:
  """One grammar matcher per row: the packed mask of each step, advanced with the drawn tokens.

  A row is done once its matcher has accepted the stop token (EOS), which a completed grammar allows and an
  incomplete one does not; from then on its mask allows EOS alone, so the row keeps drawing a valid token while
  others finish.

  Args:
    grammar: from :func:`compile_json_schema` or :func:`compile_regex` (any ``xgrammar.CompiledGrammar``).
    batch: ``B``, the rows.

  Attributes:
    done: ``[B]`` bool NumPy, the rows whose matcher accepted the stop token.
    text: ``[B]`` lists of the tokens each matcher accepted, stop token excluded.

  Examples:
    >>> from types import SimpleNamespace
    >>> import jsample
    >>> vocab = SimpleNamespace(tokens=["<eos>", "a", "b"], types=[3, 1, 1], eos=0)  # 3: a control token
    >>> constraint = Constraint(compile_regex("ab", vocab))
    >>> allowed = lambda: jsample.unpack_mask(constraint.mask()[0], 3).tolist()
    >>> allowed()
    [False, True, False]
    >>> constraint.advance([1]); allowed()
    [False, False, True]
    >>> constraint.advance([2]); allowed()  # "ab" is complete: EOS alone
    [True, False, False]
    >>> constraint.advance([0]); constraint.done.tolist(), constraint.text
    ([True], [[1, 2]])
  """

  def __init__(self, grammar: Any, batch: int = 1):
    xgr = xgrammar()
    info = grammar.tokenizer_info
    self.vocab_size = info.vocab_size
    (self.stop, *_) = info.stop_token_ids
    self.matchers = [xgr.GrammarMatcher(grammar) for _ in range(batch)]
    self.done = np.zeros(batch, bool)
    self.text: list[list[int]] = [[] for _ in range(batch)]
    self._words = np.zeros((batch, -(-self.vocab_size // 32)), np.int32)

  def mask(self) -> np.ndarray:
    """The packed mask ``[B, M]`` int32 for the next token (a fresh array: JAX may keep reading it)."""
    for row, matcher in enumerate(self.matchers):
      if self.done[row]:
        self._words[row] = 0
        self._words[row, self.stop // 32] = np.array(1 << (self.stop % 32), np.uint32).view(np.int32)
      else:
        matcher.fill_next_token_bitmask(self._words, row)
    return self._words.copy()

  def advance(self, tokens) -> None:
    """Feeds each row's drawn token (``[B]``, any array) to its matcher.

    Raises:
      ValueError: a row's token is not allowed by its grammar (the mask of :meth:`mask` was not applied).
    """
    tokens = np.asarray(tokens).reshape(-1)
    for row, (matcher, token) in enumerate(zip(self.matchers, tokens.tolist(), strict=True)):
      if self.done[row]:
        continue
      if not matcher.accept_token(token):
        raise ValueError(f"row {row}: token {token} is not allowed by its grammar; pass mask=constraint.mask()")
      if matcher.is_terminated():
        self.done[row] = True
      else:
        self.text[row].append(token)

  def completed(self) -> np.ndarray:
    """``[B]`` bool: the rows whose text so far is a whole match (done, or able to stop here)."""
    return np.array([d or m.is_completed() for d, m in zip(self.done, self.matchers, strict=True)])
