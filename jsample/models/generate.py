"""``jsample generate``: Gemma 3 270M writes text, and jsample picks every token inside a jitted decode step.

The prompt runs in one call (prefill, then the first pick); every later token is one call of a compiled step,
``decode`` (one position through the model, writing the key/value cache) followed by ``sampler.pick``. The cache,
the sampler's state and the positions are the step's carry, so nothing is recomputed and a step costs the same at
every position.

Under a grammar (:mod:`jsample.structured`) the step is two calls, the forward pass and the pick: the forward pass
of step ``t + 1`` needs only token ``t``, so it is dispatched first and the host computes the grammar's mask while
the device runs it; the pick then takes the mask. The tokens are the ones the single call draws.

Examples:
  jsample generate
  jsample generate "The capital of France is" --max-tokens 32 --temperature 0
  jsample generate "Once upon a time" --batch 8 --top-p 0.9 --seed 3
"""

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jsample
from jsample._flags import add_setting_flags, chosen_settings
from jsample._timing import seconds
from jsample.models import gemma3
from jsample.models import text as text_lib
from jsample.models.compiled import mending_compiled_programs
from jsample.models.weights import DamagedCache, MissingExtra

DEFAULT_PROMPT = "Once upon a time, in a small village by the sea,"
CONTEXT = 4096  # positions this implementation supports (prompt + generated); the prompt's attention is [L, L]
PROMPT_MULTIPLE = 8  # prompts are padded to a multiple of this, so similar lengths share one compiled prefill
CACHE_MULTIPLE = 64  # and cache lengths to a multiple of this


def check_length(tokens: int) -> None:
  """Raises ``ValueError`` naming the limit when a prompt of ``tokens`` tokens (BOS included) leaves no room.

  Examples:
    >>> check_length(CONTEXT + 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the prompt is 4097 tokens (BOS included); the supported context is 4096 tokens, ...
  """
  if tokens >= CONTEXT:
    raise ValueError(
      f"the prompt is {tokens} tokens (BOS included); the supported context is {CONTEXT} tokens, "
      "prompt and generated text together"
    )


@dataclasses.dataclass
class Stats:
  """What a generation measured; times in seconds."""

  batch: int = 1
  prompt_tokens: int = 0  # over all rows, BOS included
  prefill: float = 0.0  # the prompt's call, its first pick included
  steps: int = 0  # decode steps after the prefill; each makes one token per row
  decode: float = 0.0
  compile: float = 0.0
  sampler: float = float("nan")  # jax.jit(sampler.pick) alone on the same [B, V] logits
  grammar: float = 0.0  # host time in the grammar's masks and advances, over the decode steps

  def report(self) -> str:
    """One line: prompt and generation tokens per second, and the sampler's share of a step.

    Examples:
      >>> stats = Stats(batch=1, prompt_tokens=10, prefill=0.5, steps=4, decode=0.2, sampler=0.005)
      >>> print(stats.report())  # doctest: +ELLIPSIS
      prompt 10 tokens at 20.0 tokens/s; generation 5 tokens, 4 steps of 50.0 ms = 20.0 tokens/s; sampler 5.00 ms = ...
    """
    if not self.prefill:
      return f"stopped before the prompt ran ({self.prompt_tokens} tokens)"
    line = f"prompt {self.prompt_tokens} tokens at {self.prompt_tokens / self.prefill:.1f} tokens/s; "
    line += f"generation {self.batch * (self.steps + 1)} tokens"
    if not self.steps:
      return line + " (the prompt's call only)"
    step = self.decode / self.steps
    line += (
      f", {self.steps} steps of {step * 1e3:.1f} ms = {self.batch / step:.1f} tokens/s; "
      f"sampler {self.sampler * 1e3:.2f} ms = {100 * self.sampler / step:.1f}% of a step"
    )
    if self.grammar:
      line += f"; grammar {self.grammar / self.steps * 1e3:.2f} ms a step on the host"
    return line


def _prefill(sampler, model, tokens, lengths, state, mask, size):
  logits, cache = gemma3.prefill(model, tokens, lengths, size)
  token, state = sampler.pick(logits, state, mask=mask)
  return token, state, cache, logits


def _forward(model, token, position, cache):
  logits, cache = gemma3.decode(model, token, position, cache)
  return logits, position + 1, cache


def _step(sampler, model, token, position, cache, state, mask):
  logits, position, cache = _forward(model, token, position, cache)
  token, state = sampler.pick(logits, state, mask=mask)
  return token, position, cache, state


class Generator:
  """Compiled prefill and decode step for one batch size and one cache length.

  Args:
    text: a :class:`jsample.models.text.TextModel`.
    sampler: a :class:`jsample.Sampler` (``jsample.gemma()`` by default).

  Example (needs the ``gemma`` extra)::

    from jsample.models.text import gemma3_270m
    gen = Generator(gemma3_270m(), jsample.gemma())
    for tokens in gen.run(["The capital of France is"], max_tokens=16, seed=0, temperature=0.0):
      ...  # tokens: [B] int32 NumPy, one per step
  """

  def __init__(self, text, sampler: jsample.Sampler | None = None):
    self.text = text
    self.sampler = sampler or jsample.gemma(vocab_size=text.model.config.vocab)
    self._prefill = jax.jit(functools.partial(_prefill, self.sampler), static_argnames="size")
    self._step = jax.jit(functools.partial(_step, self.sampler), donate_argnames=("cache", "state"))
    self._forward = jax.jit(_forward, donate_argnames="cache")
    self._masked_pick = jax.jit(self.sampler.pick, donate_argnames="state")
    self._pick = jax.jit(self.sampler.pick)
    self._compiled: dict = {}
    self.stats = Stats()

  def encode(self, prompts: list[str]) -> list[list[int]]:
    """Prompts as token ids, BOS first, checked against :data:`CONTEXT`."""
    ids = [self.text.tokenizer.encode(p) for p in prompts]
    for row in ids:
      check_length(len(row))
    return ids

  def run(
    self, prompts: list[str], max_tokens: int, seed: int = 0, constraint=None, *, overlap: bool = True, **settings
  ):
    """Yields the batch's tokens, one ``[B]`` NumPy array per step, until every row has drawn EOS or
    ``max_tokens`` tokens (fewer if the context ends first). Row ``i`` draws with seed ``seed + i``.

    ``constraint`` (a :class:`jsample.structured.Constraint` with ``B`` rows) masks every draw with its grammar
    and is advanced with the drawn tokens. With ``overlap`` (the default) the host computes each step's mask while
    the device runs that step's forward pass; without, the mask comes first and the step is one call (the same
    tokens, for timing the difference). ``self.stats`` holds the timings once the generator is exhausted or closed.
    """
    ids = self.encode(prompts)
    batch, longest = len(ids), max(len(r) for r in ids)
    max_tokens = min(max_tokens, CONTEXT - longest)
    size = min(CONTEXT, -(-(longest + max_tokens) // CACHE_MULTIPLE) * CACHE_MULTIPLE)
    tokens, lengths = (jnp.asarray(a) for a in text_lib.pad(ids, PROMPT_MULTIPLE))
    state = self.sampler.init(seed=np.arange(seed, seed + batch), prompt=ids, **settings)
    self.stats = stats = Stats(batch=batch, prompt_tokens=int(sum(len(r) for r in ids)))

    def on_host(work, *args):
      """``work(*args)``, its time counted as the grammar's host time."""
      start = time.perf_counter()
      result = work(*args)
      stats.grammar += time.perf_counter() - start
      return result

    if max_tokens <= 0:
      return

    start = time.perf_counter()
    mask = None if constraint is None else constraint.mask()
    prefill, step, forward, pick = self._compile(tokens, lengths, state, mask, size)
    stats.compile = time.perf_counter() - start

    start = time.perf_counter()
    token, state, cache, logits = prefill(self.text.model, tokens, lengths, state, mask)
    out = np.asarray(token)
    stats.prefill = time.perf_counter() - start
    if constraint is not None:
      constraint.advance(out)
    done = out == self.text.tokenizer.eos
    position = lengths
    try:
      yield out
      start = time.perf_counter()
      for _ in range(max_tokens - 1):
        if done.all():
          break
        if constraint is not None and overlap:
          # The forward pass needs only the last token: dispatched (asynchronously), it runs on the device while
          # the host computes the mask of the token it leads to; the pick then waits for both.
          logits, position, cache = forward(self.text.model, token, position, cache)
          mask = on_host(constraint.mask)
          token, state = pick(logits, state, mask)
        else:
          if constraint is not None:  # the mask first, then the step: one after the other
            mask = on_host(constraint.mask)
          token, position, cache, state = step(self.text.model, token, position, cache, state, mask)
        out = np.asarray(token)
        if constraint is not None:
          on_host(constraint.advance, out)
        stats.steps += 1
        done |= out == self.text.tokenizer.eos
        yield out
    finally:
      stats.decode = time.perf_counter() - start if stats.steps else 0.0
      stats.sampler = self.time_sampler(logits, self.sampler.init(seed=np.arange(batch), prompt=ids, **settings))

  def _compile(self, tokens, lengths, state, mask, size: int):
    """The compiled prefill and step (and, under a mask, the forward pass and the pick apart) for these shapes,
    compiled ahead so that no timing includes a compile."""
    shapes = (tokens.shape, size, tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves((state, mask))))
    if shapes not in self._compiled:
      prefill = self._prefill.lower(self.text.model, tokens, lengths, state, mask, size=size).compile()
      token, _, cache, logits = jax.eval_shape(
        functools.partial(self._prefill, size=size), self.text.model, tokens, lengths, state, mask
      )
      step = self._step.lower(self.text.model, token, lengths, cache, state, mask).compile()
      forward = pick = None
      if mask is not None:
        forward = self._forward.lower(self.text.model, token, lengths, cache).compile()
        pick = self._masked_pick.lower(logits, state, mask).compile()
      self._compiled[shapes] = prefill, step, forward, pick
    return self._compiled[shapes]

  def time_sampler(self, logits: jax.Array, state: jsample.SamplerState, repeats: int = 20) -> float:
    """Median seconds of ``jax.jit(sampler.pick)`` alone on ``logits`` ``[B, V]``."""
    return seconds(self._pick, logits, state, repeats=repeats)


# -- the command line ----------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="jsample generate",
    description="Gemma 3 270M writes text; jsample's Gemma recipe picks every token in a jitted decode loop.",
    epilog="The first run dequantizes the model into ~/.cache/jsample (about 30 s, 1.1 GB) and compiles (about "
    "30 s), saying so on stderr; later runs start in a few seconds, and rebuild a damaged cache. Timings go to "
    "stderr. Exit status: 0 when done; with --json-schema or --regex, the number of rows (at most 100) that "
    "--max-tokens cut off before their grammar was complete, each named on stderr; 1 or 2 also for an error "
    "said on stderr before any text; 130 after Ctrl-C.",
  )
  p.add_argument(
    "prompt", nargs="?", default=DEFAULT_PROMPT, help=f"the text to continue (default: {DEFAULT_PROMPT!r})"
  )
  p.add_argument(
    "--max-tokens", type=int, default=64, metavar="N", help="tokens to generate per row (default: %(default)s)"
  )
  p.add_argument("--seed", type=int, default=0, metavar="S", help="row i draws with seed S + i (default: %(default)s)")
  p.add_argument(
    "--batch", type=int, default=1, metavar="N", help="rows generated together from the prompt (default: %(default)s)"
  )
  grammar = p.add_mutually_exclusive_group()
  grammar.add_argument(
    "--json-schema",
    metavar="FILE",
    help="the output is JSON valid under this schema, one row a line, numbers of bounded digits (the structured "
    "extra: llguidance); only it goes to stdout",
  )
  grammar.add_argument(
    "--regex", metavar="PATTERN", help="the output matches this regular expression (the structured extra)"
  )
  add_setting_flags(p, {"gemma": jsample.gemma()})
  return p


_latest: list[Generator] = []


def _generator(text) -> Generator:
  """The :class:`Generator` of the loaded model, kept so that repeated runs in one process reuse compiled programs
  (only the latest: it holds its model)."""
  if not _latest or _latest[0].text is not text:
    _latest[:] = [Generator(text)]
  return _latest[0]


def main(argv=None) -> int:
  """``jsample generate``; returns the exit status (130 after Ctrl-C)."""
  cli = parser()
  args = cli.parse_args(argv)
  if args.max_tokens < 1 or args.batch < 1:
    cli.error("--max-tokens and --batch must be >= 1")
  settings = chosen_settings(args, jsample.gemma().settings.values())
  try:
    jsample.gemma().init(seed=np.arange(args.seed, args.seed + args.batch), **settings)
  except ValueError as error:
    cli.error(str(error))
  grammar = args.json_schema is not None or args.regex is not None
  if grammar:  # before the model loads: a missing extra or a bad schema is known at once
    from jsample import structured

    try:
      structured.llguidance()
      schema = json.loads(Path(args.json_schema).read_text()) if args.json_schema is not None else None
    except structured.MissingExtra as error:
      print(f"jsample generate: {error}", file=sys.stderr)
      return 1
    except (OSError, ValueError) as error:
      cli.error(f"--json-schema: {error}")

  start = time.perf_counter()
  try:
    text = text_lib.gemma3_270m()
  except (MissingExtra, DamagedCache) as error:
    print(f"jsample generate: {error}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # the cache is written atomically: nothing half-written stays behind
    print("[interrupted while loading]", file=sys.stderr)
    return 130
  loaded = time.perf_counter() - start
  gen = _generator(text)
  prompts = [args.prompt] * args.batch
  try:
    (ids,) = gen.encode(prompts[:1])
  except ValueError as error:
    cli.error(str(error))
  if len(ids) + args.max_tokens > CONTEXT:
    print(f"[the context ends after {CONTEXT - len(ids)} new tokens: it holds {CONTEXT}]", file=sys.stderr)
  constraint = None
  if grammar:
    try:
      if schema is not None:
        rules = structured.compile_json_schema(schema, text.tokenizer)
      else:
        rules = structured.compile_regex(args.regex, text.tokenizer)
    except ValueError as error:
      cli.error(str(error))
    constraint = structured.Constraint(rules, args.batch)
  compiling = "compiling the prefill and the decode step (about 30 s the first time; a few seconds once cached)"
  print(f"[loaded Gemma 3 270M in {loaded:.1f} s; {compiling}]", file=sys.stderr, flush=True)

  tokenizer = text.tokenizer
  rows: list[list[int]] = [[] for _ in prompts]
  stream = tokenizer.stream() if args.batch == 1 else None
  interrupted = False
  run = gen.run(prompts, args.max_tokens, args.seed, constraint, **settings)
  try:
    with mending_compiled_programs():  # the compiles happen in the run's first step and its last
      if stream and not grammar:  # structured output goes to stdout alone, ready for a parser
        print(args.prompt, end="", flush=True)
      for tokens in run:
        for row, token in zip(rows, tokens.tolist(), strict=True):
          if tokenizer.eos not in row[-1:]:
            row.append(token)
            if stream:
              print(stream.push(token), end="", flush=True)
  except KeyboardInterrupt:
    interrupted = True
    run.close()
  if stream:
    print(stream.flush())
  elif grammar:  # one row per line (JSON Lines, for a schema)
    for row in rows:
      print(tokenizer.decode(row))
  else:
    for i, row in enumerate(rows):
      print(f"--- row {i} (seed {args.seed + i})\n{args.prompt}{tokenizer.decode(row)}")
  if interrupted:
    print("[interrupted]", file=sys.stderr)
  unfinished = [] if constraint is None or interrupted else np.flatnonzero(~constraint.done).tolist()
  if unfinished:  # the grammar was not complete when --max-tokens ran out: the text is only a prefix of a match
    print(
      f"[{len(unfinished)} of {args.batch} rows ({unfinished}): --max-tokens ended before the grammar was complete; "
      "their text is incomplete]",
      file=sys.stderr,
    )
  stats = gen.stats
  compiled = f"compiled in {stats.compile:.1f} s; " if stats.compile else ""
  print(f"[{compiled}{stats.report()}]", file=sys.stderr)
  return 130 if interrupted else min(len(unfinished), 100)
