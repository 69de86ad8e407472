"""Structured output: a grammar decides which tokens are allowed, jsample draws among them.

The grammar engine is `llguidance <https://github.com/guidance-ai/llguidance>`_ (the Rust engine llama.cpp and vLLM
use; a few MB, no PyTorch). It needs the optional extra ``structured`` (``pip install "jsample[structured]"``);
without it, the ``compile_*`` functions raise :class:`MissingExtra` naming that command. The core of jsample never
imports this module. (XGrammar, the engine before, is no longer supported: it brought PyTorch.)

A user's own decode loop needs three calls: compile the grammar once (:func:`compile_json_schema`,
:func:`compile_regex` or :func:`compile_lark`), then each step :meth:`Constraint.mask` gives the packed mask ``[B, M]``
for ``pick`` (llguidance's int32 bitmask is jsample's packed layout: bit ``j % 32`` of word ``j // 32`` allows token
``j``, so the words pass through unchanged) and :meth:`Constraint.advance` feeds the drawn tokens back;
:attr:`Constraint.done` says which rows are complete. The matchers run on the host, so a step costs one round trip:
the tokens come to the host and the mask goes back; the logits never leave the device. The mask of step ``t + 1``
needs only token ``t``, so it can be computed while the device runs the model's forward pass (``jsample generate``
does).

JSON at default settings comes out whole: :func:`bounded_schema` gives every number a bounded number of digits
(llama.cpp bounds integers the same way), and whitespace is at most one space wherever JSON allows it.

Examples:
  A stand-in vocabulary (:class:`jsample.models.tokenizer.Tokenizer` from token texts: two control tokens, digits,
  and the 256 byte tokens that spell anything else) and random logits in place of a model:

  >>> import jax, numpy as np, jsample
  >>> from jsample import structured
  >>> from jsample.models.tokenizer import Tokenizer
  >>> texts = ["<eos>", "<bos>", *"0123456789"] + [f"<0x{b:02X}>" for b in range(256)]
  >>> tokenizer = Tokenizer(texts, np.zeros(len(texts)), [3, 3] + [1] * 10 + [6] * 256, bos=1, eos=0)
  >>> grammar = structured.compile_json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 3},
  ...                                          tokenizer)
  >>> constraint = structured.Constraint(grammar, batch=2)
  >>> sampler = jsample.llama_cpp(vocab_size=len(texts))
  >>> state = sampler.init(seed=np.arange(2))
  >>> pick = jax.jit(sampler.pick)
  >>> rng = np.random.default_rng(0)
  >>> while not constraint.done.all():
  ...   logits = rng.normal(size=(2, len(texts))).astype(np.float32)  # the model's [B, V] logits
  ...   tokens, state = pick(logits, state, mask=constraint.mask())    # only tokens the grammar allows
  ...   constraint.advance(tokens)
  >>> [tokenizer.decode(row) for row in constraint.text]  # random logits: long numbers, but bounded ones
  ['[79349616]', '[6299454398508]']

``jsample generate --json-schema FILE`` and ``--regex PATTERN`` run this loop (``jsample.models.generate``).
"""

import dataclasses
import importlib
import json
import re
from typing import Any

import numpy as np

from jsample._schema_bounds import bounded_schema

INSTALL = 'pip install "jsample[structured]"'
# GGUF token types (tokenizer.ggml.token_type): normal, user-defined and byte tokens are text; control, unknown and
# unused tokens are special (a grammar never allows them; EOS is the stop token a complete grammar allows).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # ▁
WHITESPACE = " ?"  # the default JSON whitespace: at most one space at each place JSON allows whitespace


class MissingExtra(ImportError):
  """llguidance, the ``structured`` extra, is not installed; the message names the install command.

  Examples:
    >>> issubclass(MissingExtra, ImportError)
    True
  """


def llguidance() -> Any:
  """The ``llguidance`` module (with ``llguidance.numpy`` imported); :class:`MissingExtra` where it is missing.

  Examples:
    >>> llguidance().numpy.get_bitmask_shape(2, 33)
    (2, 2)
  """
  try:
    module = importlib.import_module("llguidance")
    importlib.import_module("llguidance.numpy")
  except ImportError as error:
    raise MissingExtra(f"structured output needs llguidance; install the extra: {INSTALL}") from error
  return module


@dataclasses.dataclass(frozen=True)
class Grammar:
  """A grammar compiled against one vocabulary, for :class:`Constraint`.

  Attributes:
    source: llguidance's grammar (JSON text).
    tokenizer: the ``llguidance.LLTokenizer`` of the vocabulary.
    vocab_size: ``V``.
    eos: the stop token's id.
    vocabulary: what the ``LLTokenizer`` was built from (it records a byte the vocabulary could not spell).
  """

  source: str
  tokenizer: Any
  vocab_size: int
  eos: int
  vocabulary: Any = None


def pieces(tokenizer) -> tuple[list[bytes], list[int]]:
  """Each token's bytes, and the ids of the special tokens (control, unknown, unused).

  Args:
    tokenizer: a :class:`jsample.models.Tokenizer`, or anything with ``tokens`` (``V`` texts, ``▁`` for a space,
      ``<0xXX>`` for a byte) and ``types`` (``[V]`` GGUF token types).

  Examples:
    >>> from types import SimpleNamespace
    >>> pieces(SimpleNamespace(tokens=["<eos>", "▁a", "<0x0A>"], types=[CONTROL, NORMAL, BYTE]))
    ([b'<eos>', b' a', b'\\n'], [0])
  """
  out, special = [], []
  for i, (text, kind) in enumerate(zip(tokenizer.tokens, np.asarray(tokenizer.types).tolist(), strict=True)):
    if kind == BYTE:
      out.append(bytes([int(text[3:5], 16)]))
    elif kind in (NORMAL, USER_DEFINED):
      out.append(text.replace(SPACE, " ").encode("utf-8"))
    else:
      out.append(text.encode("utf-8"))
      special.append(i)
  return out, special


class _Vocabulary:
  """What ``llguidance.TokenizerWrapper`` reads: the tokens' bytes, special ids, EOS, and an encode function."""

  def __init__(self, tokenizer):
    self.tokens, self.special_token_ids = pieces(tokenizer)
    self.eos_token_id = int(tokenizer.eos)
    self.bos_token_id = getattr(tokenizer, "bos", None)
    self._encode = tokenizer.encode
    self.unspellable = ""  # why the latest encode failed

  def __call__(self, text: str | bytes) -> list[int]:
    if isinstance(text, bytes):  # llguidance passes bytes when the function takes them
      text = text.decode("utf-8", errors="replace")
    try:
      return self._encode(text, bos=False)
    except KeyError as error:  # jsample's byte fallback: no <0xXX> token for a byte of the text
      (byte, *_) = error.args or ("?",)
      byte = f"<0x{byte:02X}>" if isinstance(byte, int) else repr(byte)
      self.unspellable = f"the grammar needs the text {text!r}, and the vocabulary has no byte token {byte} for it"
      raise


def lltokenizer(tokenizer) -> Any:
  """The ``llguidance.LLTokenizer`` of a SentencePiece vocabulary with byte fallback, such as Gemma's (about a
  second for Gemma's 262144 tokens; the latest one is kept).

  Args:
    tokenizer: a :class:`jsample.models.Tokenizer`, or anything with ``tokens``, ``types`` (see :func:`pieces`),
      ``eos`` and ``encode(text, bos=False)``.

  Examples:
    >>> import numpy as np
    >>> from jsample.models.tokenizer import Tokenizer
    >>> vocab = Tokenizer(["<eos>", "a", "b"], np.zeros(3), [CONTROL, NORMAL, NORMAL], bos=0, eos=0)
    >>> lltokenizer(vocab).vocab_size, lltokenizer(vocab).is_special_token(0)
    (3, True)
  """
  return _vocabulary(tokenizer)[0]


def _vocabulary(tokenizer) -> tuple[Any, _Vocabulary]:
  if not _latest or _latest[0] is not tokenizer:
    llg = llguidance()
    vocabulary = _Vocabulary(tokenizer)
    _latest[:] = [tokenizer, llg.LLTokenizer(llg.TokenizerWrapper(vocabulary)), vocabulary]
  return _latest[1], _latest[2]


_latest: list[Any] = []


def _one_line(message: str) -> str:
  """llguidance's message on one line: a regex error as ``regex 'PATTERN': what``, else its first line."""
  lines = message.strip().splitlines() or ["unknown error"]
  for i, line in enumerate(lines):
    if line.rstrip().endswith("regex parse error:") and i + 1 < len(lines):
      what = next((rest[7:] for rest in lines[i + 2 :] if rest.startswith("error: ")), "cannot parse it")
      return f"regex {lines[i + 1].strip()!r}: {what}"
  return re.sub(r"^at \d+\(\d+\): ", "", lines[0])


def _compile(source: str, tokenizer, what: str) -> Grammar:
  llg = llguidance()
  tok, vocabulary = _vocabulary(tokenizer)
  vocabulary.unspellable = ""
  failed, messages = llg.LLMatcher.validate_grammar_with_warnings(source, tok)
  if failed:
    raise ValueError(f"{what}: {_one_line(messages[0])}")
  grammar = Grammar(source, tok, len(tokenizer.tokens), int(tokenizer.eos), vocabulary)
  first = llg.LLMatcher(tok, source, log_level=0)
  llg.numpy.fill_next_token_bitmask(first, np.zeros((1, -(-grammar.vocab_size // 32)), np.int32))
  if first.is_error():  # the vocabulary cannot spell what the grammar starts with
    raise ValueError(f"{what}: {_stuck(first, vocabulary)}")
  return grammar


def _stuck(matcher, vocabulary: _Vocabulary | None) -> str:
  """Why ``matcher`` is in its error state, on one line."""
  if vocabulary is not None and vocabulary.unspellable:
    return vocabulary.unspellable
  return f"no token of the vocabulary continues the grammar ({_one_line(matcher.get_error())})"


def compile_json_schema(schema: str | dict, tokenizer, *, any_whitespace: bool = False, bound: bool = True) -> Grammar:
  """A JSON schema compiled against ``tokenizer``'s vocabulary, for :class:`Constraint`.

  Args:
    schema: the schema, as JSON text or a dict. Object properties come in the schema's order. A top-level
      ``"x-guidance"`` key sets llguidance's JSON options (``whitespace_pattern``, ``item_separator`` ...).
    tokenizer: see :func:`lltokenizer`.
    any_whitespace: allow any whitespace (newlines too) wherever JSON does; off by default: at most one space, so
      a row is one line and a small model cannot wander off into blank lines.
    bound: bound every number's digits (:func:`bounded_schema`).

  Returns:
    A :class:`Grammar`.

  Raises:
    ValueError: the schema is not JSON, uses what llguidance does not support (the message names it), or starts
      with text the vocabulary cannot spell.
    MissingExtra: llguidance is not installed.

  Examples:
    >>> import numpy as np
    >>> from jsample.models.tokenizer import Tokenizer
    >>> vocab = Tokenizer(["<eos>", "1", "2", "x"], np.zeros(4), [CONTROL, NORMAL, NORMAL, NORMAL], bos=0, eos=0)
    >>> constraint = Constraint(compile_json_schema({"type": "integer", "maximum": 99}, vocab))
    >>> constraint.advance([1]); constraint.advance([2]); constraint.advance([0]); constraint.done.tolist()
    [True]
    >>> compile_json_schema({"type": "string", "format": "isbn"}, vocab)
    Traceback (most recent call last):
    ...
    ValueError: json schema: Unknown format: isbn
  """
  llg = llguidance()
  if isinstance(schema, str):
    try:
      schema = json.loads(schema)
    except ValueError as error:
      raise ValueError(f"json schema: not JSON: {error}") from None
  if bound:
    schema = bounded_schema(schema)
  options = {"whitespace_flexible": True} if any_whitespace else {"whitespace_pattern": WHITESPACE}
  try:
    source = llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
  except ValueError as error:
    raise ValueError(f"json schema: {_one_line(str(error))}") from None
  return _compile(source, tokenizer, "json schema")


def compile_regex(pattern: str, tokenizer) -> Grammar:
  """A regular expression compiled against ``tokenizer``'s vocabulary, for :class:`Constraint`; the whole output
  must match it.

  Raises:
    ValueError: llguidance cannot parse the pattern (no look-arounds or backreferences), or the vocabulary
      cannot spell its first bytes (a SentencePiece vocabulary spells any text with its byte tokens
      ``<0x00>``..``<0xFF>``).
    MissingExtra: llguidance is not installed.

  Examples:
    >>> import numpy as np
    >>> from jsample.models.tokenizer import Tokenizer
    >>> vocab = Tokenizer(["<eos>", "a", "b"], np.zeros(3), [CONTROL, NORMAL, NORMAL], bos=0, eos=0)
    >>> Constraint(compile_regex("a+b", vocab)).mask().shape
    (1, 1)
    >>> compile_regex("(a", vocab)
    Traceback (most recent call last):
    ...
    ValueError: regex: regex '(a': unclosed group
    >>> compile_regex("ax", vocab)
    Traceback (most recent call last):
    ...
    ValueError: regex: the grammar needs the text 'ax', and the vocabulary has no byte token <0x78> for it
  """
  return _compile(llguidance().LLMatcher.grammar_from_regex(pattern), tokenizer, "regex")


def compile_lark(grammar: str, tokenizer) -> Grammar:
  """A context-free grammar in llguidance's Lark syntax (``start: ...``; ``%json {...}`` embeds a JSON schema),
  compiled against ``tokenizer``'s vocabulary, for :class:`Constraint`. llama.cpp's GBNF grammars convert with
  ``llguidance.gbnf_to_lark``.

  Examples:
    >>> import numpy as np
    >>> from jsample.models.tokenizer import Tokenizer
    >>> vocab = Tokenizer(["<eos>", "yes", "no"], np.zeros(3), [CONTROL, NORMAL, NORMAL], bos=0, eos=0)
    >>> import jsample
    >>> jsample.unpack_mask(Constraint(compile_lark('start: "yes" | "no"', vocab)).mask()[0], 3).tolist()
    [False, True, True]
  """
  return _compile(llguidance().LLMatcher.grammar_from_lark(grammar), tokenizer, "lark grammar")


class Constraint:
  """One llguidance matcher per row: the packed mask of each step, advanced with the drawn tokens.

  A row is done once its matcher has accepted the stop token (EOS), which a complete grammar allows and an
  incomplete one does not; from then on its mask allows EOS alone, so the row keeps drawing a valid token while
  others finish.

  Args:
    grammar: from :func:`compile_json_schema`, :func:`compile_regex` or :func:`compile_lark`.
    batch: ``B``, the rows.

  Attributes:
    done: ``[B]`` bool NumPy, the rows whose matcher accepted the stop token.
    text: ``[B]`` lists of the tokens each matcher accepted, stop token excluded.

  Examples:
    >>> import numpy as np, jsample
    >>> from jsample.models.tokenizer import Tokenizer
    >>> vocab = Tokenizer(["<eos>", "a", "b"], np.zeros(3), [CONTROL, NORMAL, NORMAL], bos=0, eos=0)
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

  def __init__(self, grammar: Grammar, batch: int = 1):
    llg = llguidance()
    self._numpy = llg.numpy
    self.vocab_size, self.stop, self._vocabulary = grammar.vocab_size, grammar.eos, grammar.vocabulary
    self.matchers = [llg.LLMatcher(grammar.tokenizer, grammar.source, log_level=0) for _ in range(batch)]
    self.done = np.zeros(batch, bool)
    self.text: list[list[int]] = [[] for _ in range(batch)]
    self._words = np.zeros((batch, -(-self.vocab_size // 32)), np.int32)
    self._eos = np.zeros_like(self._words[0])
    self._eos[self.stop // 32] = np.array(1 << (self.stop % 32), np.uint32).view(np.int32)
    self._executor = _executor(llg)

  def mask(self) -> np.ndarray:
    """The packed mask ``[B, M]`` int32 for the next token (a fresh array: JAX may keep reading it).

    Raises:
      ValueError: no token of the vocabulary continues a row's grammar (it lacks byte tokens the grammar needs).
    """
    live = [(matcher, row) for row, matcher in enumerate(self.matchers) if not self.done[row]]
    self._words[self.done] = self._eos
    if live:  # the rows' masks in parallel, outside the GIL
      self._numpy.fill_next_token_bitmask_par(self._executor, live, self._words)
    for matcher, row in live:
      if matcher.is_error():
        raise ValueError(f"row {row}, after {len(self.text[row])} tokens: {_stuck(matcher, self._vocabulary)}")
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
      if not matcher.consume_token(token):
        raise ValueError(f"row {row}: token {token} is not allowed by its grammar; pass mask=constraint.mask()")
      if token == self.stop:
        self.done[row] = True
      else:
        self.text[row].append(token)

  def completed(self) -> np.ndarray:
    """``[B]`` bool: the rows whose text so far is a whole match (done, or able to stop here)."""
    return np.array([d or m.is_accepting() for d, m in zip(self.done, self.matchers, strict=True)])


def _executor(llg) -> Any:
  """llguidance's thread pool for the rows' masks, one per process."""
  if not _pool:
    _pool.append(llg.LLExecutor())
  return _pool[0]


_pool: list[Any] = []
