"""Speculative decoding's verifier: its tokens follow the chain's distributions, it keeps what
it should, its state is the state of picking the emitted tokens, and a row's result is its own.

Every call runs under ``jit``, through a few programs shared by the tests (compiling costs
about 10 s each on 2 cores); the expectations come from ``pick``, ``probs`` and ``accept``
one step at a time, and from the float64 reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jsample
from tests import reference
from tests.helpers import NEUTRAL_PENALTIES, chi_square, llama_stages, row, settings

ROWS, DRAFT, VOCAB, WINDOW = 8, 3, 40, 16
# llama.cpp's order, with stages whose outcome depends on the state: the penalties' window and mirostat's mu
STAGES = (jsample.penalties(), jsample.top_k(), jsample.top_p(), jsample.min_p(), jsample.temperature())
SAMPLER = jsample.chain(*STAGES, jsample.mirostat(), window_size=WINDOW)
MIROSTAT = (1, 6)  # rows that run mirostat 2 after the others
PICK, PROBS, ACCEPT = jax.jit(SAMPLER.pick), jax.jit(SAMPLER.probs), jax.jit(SAMPLER.accept)
EVERYWHERE = jnp.ones((ROWS, DRAFT + 1, VOCAB), bool)
TRACES: list[int] = []


@jax.jit
def _verify(draft, q, x, state, mask):
  TRACES.append(1)
  return SAMPLER.verify(draft, q, x, state, mask)


def verify(draft, q, x, state, mask=EVERYWHERE):
  """The tests' one compiled verifier per kind of ``q`` (given or None): always with a mask, so that
  the mask's test needs no program of its own."""
  return _verify(draft, q, x, state, mask)


def rows(seed: int, greedy=()):
  """``ROWS`` rows of ``DRAFT + 1`` target logits, random settings and prompts; ``greedy`` rows at temperature 0."""
  rng = np.random.default_rng(seed)
  kinds = ("normal", "peaked", "ties", "bf16", "holes")
  x = np.stack([[row(rng, VOCAB, kinds[(b + j) % len(kinds)]) for j in range(DRAFT + 1)] for b in range(ROWS)])
  chosen = [settings(rng, VOCAB, WINDOW) for _ in range(ROWS)]
  for b in range(ROWS):
    chosen[b]["temperature"] = 0.0 if b in greedy else max(chosen[b]["temperature"], 0.3)
  per_row = {name: np.array([s[name] for s in chosen]) for name in chosen[0]}
  per_row["mirostat"] = np.isin(np.arange(ROWS), MIROSTAT) * 2
  prompts = [list(rng.integers(0, VOCAB, int(rng.integers(0, 2 * WINDOW)))) for _ in range(ROWS)]
  state = SAMPLER.init(seed=rng.integers(0, 2**31, ROWS), prompt=prompts, **per_row)
  return jnp.asarray(x), state


def picked_one_by_one(x, state):
  """``pick``'s tokens, distributions and states along the rows' own draws: ``[B, L + 1]``, ``[B, L + 1, V]``,
  and the states before each step and after the last (``L + 2``)."""
  tokens, probs, states = [], [], [state]
  for j in range(x.shape[1]):
    probs.append(PROBS(x[:, j], state))
    token, state = PICK(x[:, j], state)
    tokens.append(token)
    states.append(state)
  return jnp.stack(tokens, axis=1), jnp.stack(probs, axis=1), states


def accepted_one_by_one(tokens, state):
  """The state after ``accept``ing each row's emitted tokens (``tokens`` up to its first -1)."""
  for j in range(tokens.shape[1]):
    token = tokens[:, j]
    moved = ACCEPT(jnp.maximum(token, 0), state)
    state = jax.tree.map(
      lambda a, b, t=token: jnp.where((t >= 0).reshape((-1,) + (1,) * (a.ndim - 1)), a, b), moved, state
    )
  return state


def row_of(states, index):
  """Each row ``b``'s state from ``states[index[b]]``."""
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *states)
  return jax.tree.map(lambda a: a[np.asarray(index), np.arange(len(index))], stacked)


def assert_same_rows(a, b, what=""):
  np.testing.assert_array_equal(a.window, b.window, err_msg=f"{what}: window")
  np.testing.assert_array_equal(a.position, b.position, err_msg=f"{what}: position")


def test_a_draft_drawn_from_the_target_is_kept_whole_and_the_bonus_is_picks():
  x, state = rows(1)
  tokens, probs, states = picked_one_by_one(x, state)
  draft, q = tokens[:, :DRAFT], probs[:, :DRAFT]
  got, accepted, after = verify(draft, q, x, state)
  # q = p: every ratio is 1, so every coin keeps the token
  np.testing.assert_array_equal(accepted, np.full(ROWS, DRAFT))
  np.testing.assert_array_equal(got, tokens)  # the bonus: pick's token at row L, after the draft
  assert_same_rows(after, states[-1], "after a whole draft")
  # mirostat's mu moved by each kept token's surprise, as pick moves it (not left alone, as by accept)
  mu = np.asarray(after.stages["mirostat"])
  np.testing.assert_allclose(mu, states[-1].stages["mirostat"], rtol=1e-5)
  assert np.all(mu[list(MIROSTAT)] != np.asarray(states[-2].stages["mirostat"])[list(MIROSTAT)])


@pytest.mark.parametrize("draft_probs", ["none", "random"])
def test_greedy_rows_keep_the_argmax_prefix_and_correct_with_picks_token(draft_probs):
  x, state = rows(2, greedy=range(ROWS))
  best, _, states = picked_one_by_one(x, state)  # greedy: pick's token is the argmax after the prefix
  rng = np.random.default_rng(3)
  keep = np.arange(ROWS) % (DRAFT + 1)  # each length of matching prefix, twice
  draft = np.array(best[:, :DRAFT])
  for b in range(ROWS):
    if keep[b] < DRAFT:  # a wrong token, then anything
      draft[b, keep[b]] = (draft[b, keep[b]] + rng.integers(1, VOCAB)) % VOCAB
      draft[b, keep[b] + 1 :] = rng.integers(0, VOCAB, DRAFT - keep[b] - 1)
  q = None if draft_probs == "none" else jax.nn.softmax(jnp.asarray(rng.normal(0, 2, (ROWS, DRAFT, VOCAB))), axis=-1)
  got, accepted, after = verify(jnp.asarray(draft), q, x, state)
  np.testing.assert_array_equal(accepted, keep)
  for b in range(ROWS):
    np.testing.assert_array_equal(got[b, : keep[b] + 1], best[b, : keep[b] + 1], err_msg=f"row {b}")
    assert np.all(np.asarray(got[b, keep[b] + 1 :]) == -1)
  assert_same_rows(after, row_of(states, keep + 1), "after the correction")


def draft_near_the_target(seed: int, x):
  """A draft model that roughly agrees with the target: its ``q`` and tokens drawn from it."""
  rng = np.random.default_rng(seed)
  noisy = np.nan_to_num(np.asarray(x[:, :DRAFT]), nan=0.0, neginf=-30.0) + rng.normal(0, 1.0, (ROWS, DRAFT, VOCAB))
  q = np.exp(noisy - noisy.max(-1, keepdims=True))
  q /= q.sum(-1, keepdims=True)
  draft = np.array([[rng.choice(VOCAB, p=q[b, j]) for j in range(DRAFT)] for b in range(ROWS)])
  return jnp.asarray(draft, jnp.int32), jnp.asarray(q, jnp.float32)


def test_the_state_is_that_of_accepting_the_emitted_tokens_one_by_one():
  seen = set()
  for seed in range(3):
    x, state = rows(10 + seed, greedy=(0,))
    draft, q = draft_near_the_target(seed, x)
    tokens, accepted, after = verify(draft, q, x, state)
    seen |= set(np.asarray(accepted).tolist())
    emitted = np.asarray(tokens) >= 0
    np.testing.assert_array_equal(emitted.sum(1), np.asarray(accepted) + 1)
    kept = np.arange(DRAFT) < np.asarray(accepted)[:, None]
    np.testing.assert_array_equal(np.where(kept, tokens[:, :DRAFT], -1), np.where(kept, draft, -1))
    assert_same_rows(after, accepted_one_by_one(tokens, state), f"seed {seed}")
    # the last emitted token is one the chain lets through where it stands
    a, ids = np.asarray(accepted), np.arange(ROWS)
    before = accepted_one_by_one(jnp.where(np.arange(DRAFT + 1) < a[:, None], tokens, -1), state)
    p = np.asarray(PROBS(x[ids, a], before))
    assert np.all(p[ids, np.asarray(tokens)[ids, a]] > 0)
  assert seen >= {0, DRAFT} and len(seen) >= 3, seen  # short, long and whole drafts were all exercised


def test_a_rows_result_is_its_own_in_any_slot_or_batch():
  x, state = rows(20, greedy=(3,))
  draft, q = draft_near_the_target(21, x)
  mask = np.random.default_rng(22).random((ROWS, DRAFT + 1, VOCAB)) < 0.8
  tokens, accepted, after = verify(draft, q, x, state, mask)
  flipped = jax.tree.map(lambda a: a[::-1], (draft, q, x, state, mask))
  back_tokens, back_accepted, back_after = verify(*flipped)
  np.testing.assert_array_equal(back_tokens[::-1], tokens)
  np.testing.assert_array_equal(back_accepted[::-1], accepted)
  assert_same_rows(jax.tree.map(lambda a: a[::-1], back_after), after, "reversed batch")
  # three rows alone, one at a time under vmap (a batch of three single rows), the mask packed
  some = np.array([5, 0, 3])
  alone = jax.tree.map(lambda a: a[some], (draft, q, x, state, jsample.pack_mask(mask)))
  alone = jax.jit(jax.vmap(SAMPLER.verify))(*alone)
  np.testing.assert_array_equal(alone[0], tokens[some])
  np.testing.assert_array_equal(alone[1], accepted[some])
  assert_same_rows(alone[2], jax.tree.map(lambda a: a[some], after), "alone")


def test_changing_values_never_recompiles():
  for seed in range(3):
    x, state = rows(30 + seed, greedy=(seed,))
    draft, q = draft_near_the_target(seed, x)
    verify(draft, q, x, state)
    if seed == 0:
      traced = len(TRACES)  # the first call may compile; no later one does
  assert len(TRACES) == traced


def test_masks_per_target_row_are_obeyed():
  x, state = rows(40)
  draft, q = draft_near_the_target(41, x)
  rng = np.random.default_rng(42)
  allowed = rng.random((ROWS, DRAFT + 1, VOCAB)) < 0.5
  first = np.asarray(draft[:, 0])
  allowed[0::2, 0] |= np.eye(VOCAB, dtype=bool)[first[0::2]]  # even rows: the first draft token allowed
  allowed[1::2, 0] &= ~np.eye(VOCAB, dtype=bool)[first[1::2]]  # odd rows: masked, so refused
  tokens, accepted, after = verify(draft, q, x, state, allowed)
  tokens, accepted = np.asarray(tokens), np.asarray(accepted)
  assert np.all(accepted[1::2] == 0)
  for b in range(ROWS):
    for j in range(accepted[b] + 1):
      assert allowed[b, j, tokens[b, j]], (b, j)


def test_an_empty_draft_is_a_pick():
  x, state = rows(50)
  tokens, accepted, after = jax.jit(SAMPLER.verify)(jnp.zeros((ROWS, 0), jnp.int32), None, x[:, :1], state)
  token, picked = PICK(x[:, 0], state)
  np.testing.assert_array_equal(tokens[:, 0], token)
  np.testing.assert_array_equal(accepted, 0)
  assert_same_rows(after, picked)


def test_bad_shapes_are_refused():
  x, state = rows(60)
  draft = jnp.zeros((ROWS, DRAFT), jnp.int32)
  with pytest.raises(ValueError, match="draft_tokens"):
    SAMPLER.verify(draft[:, 1:], None, x, state)
  with pytest.raises(ValueError, match="draft_tokens"):
    SAMPLER.verify(draft.astype(jnp.float32), None, x, state)
  with pytest.raises(ValueError, match="draft_tokens"):
    SAMPLER.verify(draft.at[0, 0].set(VOCAB), None, x, state)
  with pytest.raises(ValueError, match="draft_probs"):
    SAMPLER.verify(draft, jnp.ones((ROWS, DRAFT + 1, VOCAB)), x, state)
  with pytest.raises(ValueError, match="mask"):
    SAMPLER.verify(draft, None, x, state, jnp.ones((ROWS, DRAFT, VOCAB), bool))
  with pytest.raises(ValueError, match="state"):
    SAMPLER.verify(draft[:2], None, x[:2], state)


# -- the distribution of what is emitted ------------------------------------------------------

DRAWS = 30_000
CHI = dict(temperature=0.9, top_k=0, top_p=0.95, min_p=0.02, repeat_penalty=1.6, penalty_last_n=-1)
PROMPT = [3, 3, 0, 7]


@pytest.mark.slow
def test_emitted_tokens_follow_the_target_at_the_first_and_second_position():
  # Half the rows draft from a random q (given), half deterministically (q one-hot on the drafted token).
  vocab = 12
  rng = np.random.default_rng(5)
  x = rng.normal(0, 1.2, (3, vocab)).astype(np.float32)
  q = rng.dirichlet(np.full(vocab, 0.7), 2)
  draft = np.stack([rng.choice(vocab, DRAWS, p=q[j]) for j in range(2)], axis=1)
  given = np.broadcast_to(q, (DRAWS, 2, vocab)).copy()
  deterministic = np.arange(DRAWS) >= DRAWS // 2
  given[deterministic] = np.eye(vocab)[draft[deterministic]]
  sampler = jsample.gemma(window_size=8)
  state = sampler.init(seed=np.arange(DRAWS), prompt=PROMPT, **CHI)
  tokens, accepted, _ = jax.jit(sampler.verify)(
    jnp.asarray(draft, jnp.int32), jnp.asarray(given, jnp.float32), jnp.broadcast_to(x, (DRAWS, 3, vocab)), state
  )
  tokens, accepted = np.asarray(tokens), np.asarray(accepted)

  stages = llama_stages({**NEUTRAL_PENALTIES, **CHI})
  p0 = reference.probabilities(x[0], stages, window=PROMPT)
  p1 = np.stack([reference.probabilities(x[1], stages, window=PROMPT + [t]) for t in range(vocab)])  # p1[t]: after t
  for name, rows_, kept0 in (
    ("random q", ~deterministic, np.minimum(p0, q[0])),
    ("one-hot q", deterministic, q[0] * p0),
  ):
    first = np.bincount(tokens[rows_, 0], minlength=vocab)
    assert first[p0 == 0].sum() == 0, f"{name}: emitted a token the chain removes"
    assert chi_square(first, p0) > 1e-4, name
    # P(x_0 kept) = Σ min(p0, q0) (Leviathan's β) for a random q, Σ q0 p0 for a one-hot one
    n = int(rows_.sum())
    assert stats.binomtest(int(np.sum(accepted[rows_] >= 1)), n, kept0.sum()).pvalue > 1e-4, name
    # The second token, where x_0 was kept: (t, u) with chance kept0(t) p1(u | t)
    on = rows_ & (accepted >= 1)
    pairs = np.bincount(tokens[on, 0] * vocab + tokens[on, 1], minlength=vocab * vocab)
    joint = (kept0[:, None] * p1).reshape(-1)
    assert pairs[joint == 0].sum() == 0, f"{name}: a second token the chain removes"
    assert chi_square(pairs, joint) > 1e-4, name
