"""PyTorch engines' samplers, written from their published descriptions, timed when ``torch`` is importable.

jsample never imports torch: the benchmark does, only here, and only if it is
installed (``available()``); without it these peers are skipped. Each peer
takes ``[B, V]`` logits as a torch tensor and static settings, and returns one
token per row:

- ``vllm_sort``: vLLM's sampler on GPU. Temperature, min-p, then top-k and
  top-p by sorting the row, masking in sorted order and scattering back; a
  softmax; an exponential race, ``argmax(p / q)`` with ``q ~ Exp(1)``.
- ``topk_multinomial``: ``torch.topk`` to ``k`` candidates, top-p among them,
  ``torch.multinomial`` (needs top-k on).
- ``softmax_race``: pure sampling, a softmax over the row and the exponential
  race.
"""

import statistics
import time
from typing import NamedTuple

import numpy as np

try:
  import torch
except ImportError:  # the benchmark runs without it; these peers are skipped
  torch = None


class Peer(NamedTuple):
  name: str
  description: str
  sample: object  # (logits, temperature, top_k, top_p, min_p) -> tokens [B]
  needs_top_k: bool = False


def available() -> bool:
  return torch is not None


def device() -> str:
  return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def _race(probs):
  q = torch.empty_like(probs).exponential_(1.0)
  return probs.div(q).argmax(dim=-1)


def vllm_sort(logits, temperature, top_k, top_p, min_p):
  x = logits.float() / temperature
  batch, vocab = x.shape
  if min_p > 0:
    probs = x.softmax(dim=-1)
    x = x.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
  if 0 < top_k < vocab or top_p < 1:
    ranked, order = x.sort(dim=-1, descending=False)  # ascending: the best token last
    if 0 < top_k < vocab:
      kth = ranked[:, vocab - top_k].unsqueeze(1)
      ranked = ranked.masked_fill(ranked < kth, float("-inf"))
    if top_p < 1:
      cumulative = ranked.softmax(dim=-1).cumsum(dim=-1)
      drop = cumulative <= 1 - top_p
      drop[:, -1] = False  # the best token always survives
      ranked = ranked.masked_fill(drop, float("-inf"))
    x = torch.empty_like(ranked).scatter_(-1, order, ranked)
  return _race(x.softmax(dim=-1))


def topk_multinomial(logits, temperature, top_k, top_p, min_p):
  values, ids = (logits.float() / temperature).topk(top_k, dim=-1)  # sorted, best first
  if top_p < 1:
    probs = values.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each candidate
    values = values.masked_fill(before >= top_p, float("-inf"))
  pick = torch.multinomial(values.softmax(dim=-1), 1)
  return ids.gather(-1, pick)[:, 0]


def softmax_race(logits, temperature, top_k, top_p, min_p):
  return _race((logits.float() / temperature).softmax(dim=-1))


PEERS = (
  Peer("vllm sort", "vLLM's PyTorch sort path: sort, mask, scatter, exponential race", vllm_sort),
  Peer("torch.topk", "torch.topk chain, then torch.multinomial", topk_multinomial, needs_top_k=True),
  Peer("softmax race", "PyTorch softmax and exponential race (pure sampling)", softmax_race),
)


def tensor(host: np.ndarray, dtype_name: str):
  """The logits ``[B, V]`` on torch's device, as float32 or bfloat16."""
  x = torch.from_numpy(np.ascontiguousarray(host, np.float32)).to(device())
  return x.to(torch.bfloat16) if dtype_name == "bfloat16" else x


def seconds(fn, *args, repeats: int) -> float:
  """Median wall time of ``fn(*args)``, synchronised, after one warm-up call."""
  sync = torch.cuda.synchronize if device() == "cuda" else (lambda: None)
  with torch.inference_mode():
    fn(*args)
    sync()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn(*args)
      sync()
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def floor(x, repeats: int) -> float:
  """PyTorch's own read floor: ``amax`` over each row."""
  return seconds(lambda x: x.amax(dim=-1), x, repeats=repeats)
