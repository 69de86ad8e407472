"""Invariants under fuzzing (hypothesis): every stage and recipe, on rows, settings,
masks and windows nobody wrote by hand, against the float64 reference.

Compilation dominates in JAX, so shapes come from a small fixed set and every
compiled function is built once per configuration and reused by all examples.
Hypothesis draws the structure (row kinds, settings at and inside their limits,
mask densities, prompts) and a NumPy seed for the bulk values; runs are
derandomized, so CI sees the same examples every time. For a deeper search,
multiply every budget: ``JSAMPLE_FUZZ_SCALE=20 python3 -m pytest tests/test_properties.py``.
"""

import functools
import os

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from tests import reference
from tests.helpers import FUZZ_KINDS, NEUTRAL, NUDGE, fuzz_row

WINDOW = 8
ROWS = 8  # every batch is compiled at this size; fewer live rows are padded
F32_MAX = np.finfo(np.float32).max

SCALE = float(os.environ.get("JSAMPLE_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
  return max(1, round(n * SCALE))


FUZZ = hypothesis.settings(
  max_examples=examples(12),
  derandomize=True,
  deadline=None,
  database=None,
  suppress_health_check=list(hypothesis.HealthCheck),
)

# -- the samplers under test -------------------------------------------------------

CHAINS = {
  "llama_cpp": lambda **kw: jsample.llama_cpp(**kw),
  "gemma": lambda **kw: jsample.gemma(**kw),
  "hf": lambda **kw: jsample.hf(**kw),
  # vLLM's order (min-p before top-k/top-p), built by hand
  "custom": lambda **kw: jsample.chain(
    jsample.penalties(), jsample.min_p(), jsample.top_k(), jsample.top_p(), jsample.temperature(), **kw
  ),
  "top_k": lambda **kw: jsample.chain(jsample.top_k(), **kw),
  "top_p": lambda **kw: jsample.chain(jsample.top_p(), **kw),
  "min_p": lambda **kw: jsample.chain(jsample.min_p(), **kw),
  "temperature": lambda **kw: jsample.chain(jsample.temperature(), **kw),
  "penalties": lambda **kw: jsample.chain(jsample.penalties(), **kw),
}

# (chain, V, mask form): each compiles once. The budget K=8 is below most V, so
# both the candidate path and the full-vocabulary path run.
CONFIGS = [
  ("llama_cpp", 1, None),
  ("llama_cpp", 7, "bool"),
  ("llama_cpp", 33, "packed"),
  ("llama_cpp", 100, None),
  ("llama_cpp", 1000, "packed"),
  ("gemma", 100, "bool"),
  ("hf", 33, None),
  ("hf", 1000, "bool"),
  ("custom", 100, "packed"),
  ("top_k", 33, "bool"),
  ("top_p", 33, None),
  ("min_p", 7, "packed"),
  ("temperature", 100, "bool"),
  ("penalties", 33, None),
  # the accelerator strategy, batched and branch-free, on a CPU
  pytest.param("llama_cpp@accelerator", 100, "packed", marks=pytest.mark.exhaustive),
  pytest.param("hf@accelerator", 1000, "bool", marks=pytest.mark.exhaustive),
  pytest.param("custom@accelerator", 33, None, marks=pytest.mark.exhaustive),
]


@functools.cache
def sampler(chain: str, candidates: int = 8):
  """``chain`` names a recipe of CHAINS, with ``@accelerator`` for that strategy (the default: the machine's)."""
  name, _, strategy = chain.partition("@")
  return CHAINS[name](window_size=WINDOW, budget=candidates, **({"strategy": strategy} if strategy else {}))


@functools.cache
def run(chain: str, candidates: int = 8):
  """``(probs, draw)`` of a batch in one compiled function."""
  s = sampler(chain, candidates)
  return jax.jit(lambda x, state, mask: (s.probs(x, state, mask), s.pick_with_info(x, state, mask)[0]))


# -- what hypothesis draws ---------------------------------------------------------


def as_the_chain_sees(x: np.ndarray) -> np.ndarray:
  """The row the reference should get: +inf is the largest float, and XLA on CPU
  flushes subnormals to zero (consistently on both paths)."""
  x = np.where(x == np.inf, F32_MAX, x)
  return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0), x).astype(np.float32)


@st.composite
def row_settings(draw, vocab: int) -> dict:
  """One row's settings, each at a limit, neutral, or inside its range."""
  unit = st.floats(1e-6, 1.0, allow_subnormal=False)
  return dict(
    top_k=draw(st.one_of(st.sampled_from([0, -1, 1, vocab, vocab + 3]), st.integers(1, max(1, vocab)))),
    top_p=draw(st.one_of(st.sampled_from([1.0, 1e-6, 0.5]), unit)),
    min_p=draw(st.one_of(st.sampled_from([0.0, 1.0, 1e-6]), unit)),
    temperature=draw(st.one_of(st.sampled_from([0.0, -1.0, 1.0, 1e-9, 1e9]), st.floats(0.05, 3.0))),
    repeat_penalty=draw(st.one_of(st.just(1.0), st.floats(0.2, 3.0))),
    frequency_penalty=draw(st.one_of(st.just(0.0), st.floats(-1.0, 1.0))),
    presence_penalty=draw(st.one_of(st.just(0.0), st.floats(-1.0, 1.0))),
    penalty_last_n=draw(st.sampled_from([-1, 0, 1, WINDOW // 2, WINDOW])),
  )


@st.composite
def batches(draw, vocab: int, masked: bool, live: int = ROWS):
  """``live`` rows of the given width, their settings, prompts and (optional) mask."""
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  kinds = draw(st.lists(st.sampled_from(FUZZ_KINDS), min_size=live, max_size=live))
  x = np.stack([fuzz_row(rng, vocab, kind) for kind in kinds])
  settings = [draw(row_settings(vocab)) for _ in range(live)]
  prompts = [draw(st.lists(st.integers(0, vocab - 1), max_size=2 * WINDOW)) for _ in range(live)]
  allowed = None
  if masked:
    density = draw(st.lists(st.sampled_from([1.0, 0.5, 0.1, 0.0]), min_size=live, max_size=live))
    allowed = rng.random((live, vocab)) < np.array(density)[:, None]
    allowed[np.array(density) == 1.0] = True
  return x, settings, prompts, allowed


def init(chain: str, settings: list[dict], prompts: list, candidates: int = 8):
  s = sampler(chain, candidates)
  per_row = {name: np.array([row[name] for row in settings]) for name in s.settings if name in settings[0]}
  return s.init(seed=np.arange(len(settings)) * 31 + 7, prompt=prompts, **per_row)


def form(allowed, kind):
  if allowed is None or kind is None:
    return None
  return jnp.asarray(allowed) if kind == "bool" else jsample.pack_mask(allowed)


# The stages the reference runs; the recipes' others (DRY, typical, XTC, ...) stay at their neutral defaults here.
MODELLED = ("penalties", "top_k", "top_p", "min_p", "temperature")


def reference_stages(chain: str, row: dict) -> list:
  stages = []
  for stage in sampler(chain).stages:
    if stage.name not in MODELLED:
      continue
    if stage.name == "penalties":
      names = dict(repeat="repeat_penalty", frequency="frequency_penalty", presence="presence_penalty")
      value = {k: row[v] for k, v in names.items()} | dict(last_n=row["penalty_last_n"])
    else:
      value = row[stage.name]
    stages.append((stage.name, value))
  return stages


# -- 1. the token and the distribution, against the reference ----------------------


@pytest.mark.parametrize("chain, vocab, mask", CONFIGS, ids=lambda v: str(v))
def test_tokens_and_probabilities_follow_the_reference(chain, vocab, mask):
  @FUZZ
  @hypothesis.given(batches(vocab, mask is not None))
  def check(batch):
    x, settings, prompts, allowed = batch
    probs, drawn = run(chain)(jnp.asarray(x), init(chain, settings, prompts), form(allowed, mask))
    probs, token, valid = np.asarray(probs, np.float64), np.asarray(drawn.token), np.asarray(drawn.valid)
    assert np.all(np.isfinite(probs)) and np.all(np.isfinite(drawn.logprob))
    assert np.all((token >= 0) & (token < vocab))
    seen = as_the_chain_sees(x)
    for i in range(len(x)):
      kw = dict(window=prompts[i][-WINDOW:], mask=None if allowed is None else allowed[i])
      stages = reference_stages(chain, settings[i])
      mid = reference.probabilities(seen[i], stages, **kw)
      narrow, _ = reference.survivors_and_logits(seen[i], stages, nudge=-NUDGE, **kw)
      wide, final = reference.survivors_and_logits(seen[i], stages, nudge=NUDGE, **kw)
      where = f"row {i}: {settings[i]}, prompt {prompts[i]}, row {x[i].tolist()}"
      assert valid[i] == wide.any(), where
      if not valid[i]:
        assert token[i] == 0 and np.all(probs[i] == 0), where
        continue
      assert wide[token[i]], f"token {token[i]} outside the reference's survivors; {where}"
      assert allowed is None or allowed[i, token[i]], where
      got = probs[i] > 0
      assert np.all(got <= wide), where
      assert np.all((narrow & (mid > 1e-30)) <= got), where  # tokens float32 can represent
      np.testing.assert_allclose(probs[i].sum(), 1.0, atol=1e-5, err_msg=where)
      expected = mid
      if not np.array_equal(narrow, wide):
        expected = np.where(got, np.exp(final - final[got].max()), 0.0)
        expected /= expected.sum()
      np.testing.assert_allclose(probs[i], expected, atol=1e-6, err_msg=where)
      if settings[i]["temperature"] <= 0 and "temperature" in dict(stages):
        penalised = penalised_row(seen[i], stages, kw["window"], kw["mask"])
        assert token[i] == np.argmax(penalised), f"greedy: the first best id; {where}"

  check()


def penalised_row(x, stages, window, mask):
  """The row after mask and penalties, for greedy: its first maximum is the token."""
  y = np.where(np.isnan(x), -np.inf, x).astype(np.float32)
  if mask is not None:
    y = np.where(mask, y, -np.inf)
  penalties = dict(stages).get("penalties")
  if penalties is not None:
    y = np.where(y > -np.inf, reference.penalise(y, list(window), **penalties), -np.inf)
  return y


# -- 2. neutral settings, and raising a limit --------------------------------------


@pytest.mark.parametrize("chain, vocab, mask", [CONFIGS[i] for i in (3, 5, 7, 8)], ids=lambda v: str(v))
def test_neutral_settings_are_the_identity(chain, vocab, mask):
  @FUZZ
  @hypothesis.given(batches(vocab, mask is not None), st.sampled_from([-1, 0, WINDOW]))
  def check(batch, last_n):
    x, _, prompts, allowed = batch
    settings = [dict(NEUTRAL, penalty_last_n=last_n)] * len(x)
    probs, _ = run(chain)(jnp.asarray(x), init(chain, settings, prompts), form(allowed, mask))
    seen = as_the_chain_sees(x).astype(np.float64)
    seen = np.where(np.isnan(seen) | (allowed is not None and ~allowed), -np.inf, seen)
    top = np.max(seen, axis=1, keepdims=True)
    e = np.exp(seen - np.where(np.isfinite(top), top, 0))
    expected = e / np.maximum(e.sum(axis=1, keepdims=True), 1e-300)
    np.testing.assert_allclose(probs, expected, atol=1e-6)

  check()


@pytest.mark.parametrize("chain, vocab, mask", [CONFIGS[i] for i in (2, 6, 8)], ids=lambda v: str(v))
@pytest.mark.parametrize("name", ["top_k", "top_p", "min_p"])
def test_loosening_a_truncation_never_removes_a_survivor(chain, vocab, mask, name):
  """A larger top-k or top-p, or a smaller min-p, keeps every survivor."""

  @FUZZ
  @hypothesis.given(batches(vocab, mask is not None), st.floats(0.0, 1.0))
  def check(batch, amount):
    x, settings, prompts, allowed = batch
    looser = []
    for row in settings:
      row = dict(row)
      if name == "top_k":
        row["top_k"] = 0 if row["top_k"] <= 0 else row["top_k"] + int(amount * vocab)
      elif name == "top_p":  # a step above float32 rounding, or none
        row["top_p"] = min(1.0, row["top_p"] * (1 + 1e-4) + amount) if amount > 0 else row["top_p"]
      else:
        row["min_p"] = row["min_p"] * (1 - amount)
      looser.append(row)
    m = form(allowed, mask)
    before, _ = run(chain)(jnp.asarray(x), init(chain, settings, prompts), m)
    after, _ = run(chain)(jnp.asarray(x), init(chain, looser, prompts), m)
    lost = (np.asarray(before) > 0) & ~(np.asarray(after) > 0)
    assert not lost.any(), [(settings[i], looser[i]) for i in np.flatnonzero(lost.any(axis=1))]

  check()


# -- 3. what a row's token must not depend on ---------------------------------------


@functools.cache
def single(chain: str):
  s = sampler(chain)
  return jax.jit(lambda x, state, mask: s.pick(x, state, mask)[0])


@functools.cache
def picker(chain: str, candidates: int):
  s = sampler(chain, candidates)
  return jax.jit(lambda x, state, mask: s.pick(x, state, mask)[0])


@pytest.mark.parametrize(
  "chain, vocab",
  [
    ("llama_cpp", 33),
    pytest.param("hf", 100, marks=pytest.mark.exhaustive),
    ("custom", 7),
    pytest.param("llama_cpp@accelerator", 100, marks=pytest.mark.exhaustive),
  ],
  ids=str,
)
def test_a_rows_token_is_its_own(chain, vocab):
  """Batch composition, slot, batch size, candidate budget, jit and the mask form
  never change a row's token."""

  @hypothesis.settings(FUZZ, max_examples=examples(6))
  @hypothesis.given(batches(vocab, True), st.permutations(range(ROWS)), st.integers(1, ROWS))
  def check(batch, order, live):
    x, settings, prompts, allowed = batch
    state = init(chain, settings, prompts)
    xs, packed, bools = jnp.asarray(x), jsample.pack_mask(allowed), jnp.asarray(allowed)
    tokens = np.asarray(picker(chain, 8)(xs, state, bools))
    # the packed form; other candidate budgets (1: nearly always the full path)
    np.testing.assert_array_equal(picker(chain, 8)(xs, state, packed), tokens)
    np.testing.assert_array_equal(picker(chain, 1)(xs, state, bools), tokens)
    np.testing.assert_array_equal(picker(chain, 64)(xs, state, bools), tokens)
    # another slot, beside other rows
    order = np.array(order)
    moved = jax.tree.map(lambda a: a[order], state)
    np.testing.assert_array_equal(picker(chain, 8)(xs[order], moved, bools[order]), tokens[order])
    # fewer live rows: the rest replaced by empty rows with other settings
    others = init(chain, settings[::-1], prompts[::-1])
    mixed = jax.tree.map(lambda a, b: jnp.concatenate([a[:live], b[live:]]), state, others)
    empty = xs.at[live:].set(-jnp.inf)
    np.testing.assert_array_equal(picker(chain, 8)(empty, mixed, bools)[:live], tokens[:live])
    # alone, as an unbatched row
    i = live - 1
    alone = jax.tree.map(lambda a: a[i], state)
    assert int(single(chain)(xs[i], alone, bools[i])) == tokens[i]

  check()


def test_a_stage_skipped_for_the_batch_leaves_each_rows_token_alone():
  """The CPU strategy skips a stage that every row of the batch has neutral (``Stage.is_neutral``): a row's token,
  log-prob and probabilities are the same, bit for bit, beside rows with every llama.cpp stage off or on."""
  vocab, live = 1000, len(FUZZ_KINDS)
  rng = np.random.default_rng(3)
  x = np.stack([fuzz_row(rng, vocab, kind) for kind in FUZZ_KINDS] + [rng.normal(0, 3, vocab).astype(np.float32)])
  prompts = [[int(t) for t in rng.integers(0, 40, 2 * WINDOW)] for _ in range(live + 1)]
  on = dict(
    repeat_penalty=1.3,
    dry_multiplier=0.8,
    top_n_sigma=2.0,
    typical_p=0.9,
    xtc_probability=0.5,
    xtc_threshold=0.1,
    mirostat=2,
  )
  s = jsample.llama_cpp(window_size=WINDOW, budget=8, strategy="cpu")
  bias = np.full((live + 1, 16), -1, np.int32)
  bias[live, 0] = 5
  values = {k: [s.settings[k].default] * live + [v] for k, v in on.items()}
  mixed = s.init(seed=np.arange(live + 1), prompt=prompts, logit_bias_ids=bias, **values)
  # The same rows with the last one's stages off too, so that every row is neutral: the same shapes, one program.
  alone = s.configure(
    mixed, logit_bias_ids=np.full_like(bias, -1), **{k: [s.settings[k].default] * (live + 1) for k in on}
  )
  run = jax.jit(lambda x, state: (s.probs(x, state), s.pick_with_info(x, state)[0]))
  probs, drawn = run(jnp.asarray(x), mixed)
  skipped_probs, skipped = run(jnp.asarray(x), alone)
  skipped_probs, skipped = skipped_probs[:live], jax.tree.map(lambda a: a[:live], skipped)
  np.testing.assert_array_equal(np.asarray(skipped.token), np.asarray(drawn.token)[:live])
  np.testing.assert_array_equal(np.asarray(skipped.logprob), np.asarray(drawn.logprob)[:live])
  np.testing.assert_array_equal(np.asarray(skipped_probs), np.asarray(probs)[:live])


def test_op_by_op_equals_jit():
  """Run op by op (``jax.disable_jit``: each operation on its own, the conditionals and loops in Python), the
  sampler draws what its compiled program draws. (Called outside ``jit``, it compiles the program: see
  ``test_a_call_outside_jit_compiles_once``.)"""
  chain, vocab = "llama_cpp", 33

  @hypothesis.settings(FUZZ, max_examples=examples(2))  # op-by-op dispatch is slow
  @hypothesis.given(batches(vocab, True))
  def check(batch):
    x, settings, prompts, allowed = batch
    state = init(chain, settings, prompts)
    with jax.disable_jit():
      eager, _ = sampler(chain).pick(jnp.asarray(x), state, jnp.asarray(allowed))
    np.testing.assert_array_equal(eager, picker(chain, 8)(jnp.asarray(x), state, jnp.asarray(allowed)))

  check()
