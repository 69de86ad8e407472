"""The batched, branch-free blocks give bit for bit what the per-row functions give.

Every block is checked against the function it stands in for, on rows of every
kind in ``tests/rows.py``, at widths 1, 7, 1000 and 4099 (4099 > 128 groups of
32, so ``noise.race_row`` takes its group-bound path there) and batches of 0, 1
and 5 rows (the default run: 4099 x 5 and 7 x 0; the rest in the exhaustive tier);
and its program is checked for branches and loops.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from bench import batched
from jsample._src.kernels import cut, noise, search
from jsample._src.kernels.rowmath import logsumexp
from tests import helpers as rows

VOCABS = (1, 7, 1000, 4099)
BATCHES = (0, 1, 5)
# The default run checks each block at one width and batch, 4099 x 5 (past 128 groups of 32, so the race takes
# its group-bound path, and not a multiple of 32, so the padded words are exercised), and the empty batch at
# width 7; every other width and batch is in the exhaustive tier. Each pair compiles every block anew.
DEFAULT_GRID = ((4099, 5), (7, 0))
GRID = [
  pytest.param(vocab, batch, marks=() if (vocab, batch) in DEFAULT_GRID else pytest.mark.exhaustive)
  for vocab in VOCABS
  for batch in BATCHES
]
FMAX = np.finfo(np.float32).max

per_row_prefix = jax.jit(jax.vmap(search.shortest_prefix))
batched_prefix = jax.jit(batched.shortest_prefix, static_argnames="bits")
per_row_race = jax.jit(jax.vmap(noise.race_row))
batched_race = jax.jit(batched.race)
plain_race = jax.jit(batched.race_plain)
batched_greedy = jax.jit(batched.greedy)
batched_normalisers = jax.jit(batched.log_normalisers)
cut_normalisers = jax.jit(cut.log_normalisers)
branch_free_normalisers = jax.jit(functools.partial(cut.log_normalisers, branch_free=True))
per_row_normalisers = jax.jit(jax.vmap(lambda raw, mask: logsumexp(cut.clean_row(raw, mask))))
per_row_normalisers_unmasked = jax.jit(jax.vmap(lambda raw: logsumexp(cut.clean_row(raw, None))))
masses_from = jax.jit(lambda key, bound, w: jnp.sum(jnp.where(key >= bound[:, None], w, 0.0), axis=-1))


def batch_of(rng, batch: int, vocab: int, kind: str | None = None) -> np.ndarray:
  """``[B, V]`` float32 rows, of one kind or of every kind in turn."""
  kinds = [kind] * batch if kind else [rows.KINDS[i % len(rows.KINDS)] for i in range(batch)]
  return np.array([rows.row(rng, vocab, k) for k in kinds], np.float32).reshape(batch, vocab)


def cleaned(x: np.ndarray) -> jax.Array:
  return jax.vmap(cut.clean)(jnp.asarray(x))


def masses(logits: jax.Array) -> jax.Array:
  return jnp.exp(logits - jax.vmap(logsumexp)(logits)[:, None])


def packed(allowed: np.ndarray) -> jax.Array:
  """``jsample.pack_mask``, also for no rows (which it cannot reshape)."""
  if not allowed.shape[0]:
    return jnp.zeros((0, -(-allowed.shape[1] // 32)), jnp.int32)
  return jsample.pack_mask(allowed)


def bits_for(vocab: int) -> int:
  return {7: 3, 1000: 2}.get(vocab, 4)  # other widths as well as the default, at no extra compile


# -- shortest_prefix ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab, batch", GRID)
def test_shortest_prefix_by_mass_matches_the_per_row_search(vocab, batch):
  rng = np.random.default_rng(vocab * 10 + batch)
  bits = bits_for(vocab)
  for kind in rows.KINDS:
    logits = cleaned(batch_of(rng, batch, vocab, kind))
    weight = masses(logits)
    key = search.order_key(logits)
    # The targets that decide a prefix are its own sums: aim exactly at one,
    # and one float either side of it, where any other summation order would
    # tip the other way.
    at = key[jnp.arange(batch), jnp.asarray(rng.integers(0, vocab, batch))]
    exact = masses_from(key, at, weight)
    targets = [
      rng.uniform(0, 1, batch),
      rng.uniform(0.9, 1, batch),
      rng.choice([0.0, -1.0, 1e-30, 1e-45, 1.0, 1.5], batch),
      exact,
      np.nextafter(exact, np.float32(2)),
      np.nextafter(exact, np.float32(0)),
    ]
    for target in targets:
      target = jnp.asarray(target, jnp.float32)
      want = per_row_prefix(logits, weight, target)
      np.testing.assert_array_equal(batched_prefix(logits, weight, target, bits=bits), want, err_msg=kind)


@pytest.mark.parametrize("vocab, batch", GRID)
def test_shortest_prefix_by_count_matches_the_per_row_search(vocab, batch):
  rng = np.random.default_rng(vocab * 10 + batch + 1)
  bits = bits_for(vocab)
  for kind in rows.KINDS:
    logits = cleaned(batch_of(rng, batch, vocab, kind))
    count = (logits > -jnp.inf).astype(jnp.int32)
    for k in ([-3, 0, 1, vocab, vocab + 5], list(rng.integers(1, vocab + 1, 5))):
      target = jnp.asarray(rng.choice(k, batch), jnp.int32)
      want = per_row_prefix(logits, count, target)
      np.testing.assert_array_equal(batched_prefix(logits, count, target, bits=bits), want, err_msg=kind)


@pytest.mark.parametrize("bits", [1, 5])
def test_shortest_prefix_does_not_depend_on_the_bits_per_pass(bits):
  rng = np.random.default_rng(bits)
  logits = cleaned(batch_of(rng, 6, 1000))
  weight = masses(logits)
  target = jnp.asarray(rng.uniform(0, 1, 6), jnp.float32)
  want = per_row_prefix(logits, weight, target)
  np.testing.assert_array_equal(batched_prefix(logits, weight, target, bits=bits), want)


def test_shortest_prefix_breaks_ties_by_id():
  # Every token tied: the prefix is the lowest ids, however the weight is spread.
  logits = jnp.zeros((3, 10))
  weight = jnp.asarray([[0.1] * 10, [0.0, 0.5, 0.0, 0.5] + [0.0] * 6, [1.0] + [0.0] * 9], jnp.float32)
  got = batched_prefix(logits, weight, jnp.asarray([0.35, 0.6, 0.5], jnp.float32))
  np.testing.assert_array_equal(got, per_row_prefix(logits, weight, jnp.asarray([0.35, 0.6, 0.5], jnp.float32)))
  assert np.asarray(got).sum(axis=1).tolist() == [4, 4, 1]


# -- race -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab, batch", GRID)
def test_race_matches_the_per_row_race(vocab, batch):
  rng = np.random.default_rng(vocab * 10 + batch + 2)
  for kind in rows.KINDS:
    for _ in range(3):
      x = batch_of(rng, batch, vocab, kind)
      if batch:
        x[0, rng.integers(0, vocab)] = np.inf
        x[-1] = -np.inf if rng.random() < 0.5 else x[-1]  # sometimes nothing survives
      logits = jnp.asarray(x)
      words = jnp.asarray(rng.integers(0, 2**32, (batch, 2), dtype=np.uint32))
      want = per_row_race(logits, words)
      for got in (batched_race(logits, words), plain_race(logits, words)):
        np.testing.assert_array_equal(got[0], want[0], err_msg=kind)
        np.testing.assert_array_equal(got[1], want[1], err_msg=kind)


@pytest.mark.parametrize("vocab", [33, 4099, 8192])
def test_race_noise_is_noise_gumbel(vocab):
  words = jnp.asarray(np.random.default_rng(vocab).integers(0, 2**32, (4, 2), dtype=np.uint32))
  want = jax.vmap(noise.gumbel, in_axes=(0, None))(words, jnp.arange(vocab, dtype=jnp.int32))
  np.testing.assert_array_equal(jax.jit(batched._noise, static_argnums=1)(words, vocab), want)


# -- greedy ---------------------------------------------------------------------------------------------------------


def hostile(rng, x: np.ndarray) -> np.ndarray:
  """Rows that test the cleaning: +inf beside the largest float, signed zeros, nothing left."""
  batch, vocab = x.shape
  x = x.copy()
  if batch >= 1:
    spots = rng.choice(vocab, min(vocab, 2), replace=False)
    x[0, spots[-1]] = np.inf
    x[0, spots[0]] = FMAX  # ties with the +inf: the lower id wins either way round
  if batch >= 3:
    x[1] = np.where(rng.random(vocab) < 0.5, -0.0, 0.0)
    x[2] = np.nan
  return x


def as_dtype(x: np.ndarray, dtype) -> jax.Array:
  with np.errstate(over="ignore"):  # the largest float32 is +inf in float16
    return jnp.asarray(x.astype(dtype))


@pytest.mark.parametrize("vocab, batch", GRID)
def test_greedy_matches_the_greedy_chain(vocab, batch):
  rng = np.random.default_rng(vocab * 10 + batch + 3)
  sampler = jsample.chain(jsample.temperature(0.0))
  pick = jax.jit(sampler.pick_with_info)
  state = sampler.init(seed=np.arange(batch))
  for kind in rows.KINDS:
    x = hostile(rng, batch_of(rng, batch, vocab, kind))
    allowed = rng.random((batch, vocab)) < 0.5
    masks = {"none": None, "bool": jnp.asarray(allowed), "packed": packed(allowed)}
    # Each pair compiles the chain anew: every dtype and every mask form, not every pairing.
    for dtype, mask in [(jnp.float32, "none"), (jnp.float32, "packed"), (jnp.bfloat16, "bool"), (jnp.float16, "none")]:
      raw = as_dtype(x, dtype)
      token, valid = batched_greedy(raw, masks[mask])
      if not batch:  # the chain itself cannot cut no rows wider than its budget of chunks
        assert token.shape == valid.shape == (0,)
        continue
      drawn, _ = pick(raw, state, masks[mask])
      where = f"{kind} {jnp.dtype(dtype).name} {mask}"
      np.testing.assert_array_equal(token, drawn.token, err_msg=where)
      np.testing.assert_array_equal(valid, drawn.valid, err_msg=where)


def test_greedy_reads_the_cleaned_row():
  x = jnp.asarray(
    [
      [1.0, np.inf, FMAX, 2.0],  # +inf is the largest float: ties with it, and id 1 is lower
      [-0.0, 0.0, -1.0, -0.0],  # -0 equals +0: id 0
      [np.nan, np.nan, 1.0, np.nan],  # NaN is -inf
      [np.nan, -np.inf, np.nan, -np.inf],  # nothing survives
    ],
    jnp.float32,
  )
  token, valid = batched_greedy(x, None)
  assert token.tolist() == [1, 0, 2, 0]
  assert valid.tolist() == [True, True, True, False]
  token, valid = batched_greedy(x, jnp.asarray([[True, False, True, True]] * 4))
  assert token.tolist() == [2, 0, 2, 0]


# -- log_normalisers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab, batch", GRID)
def test_log_normalisers_match_the_per_row_ones(vocab, batch):
  rng = np.random.default_rng(vocab * 10 + batch + 4)
  for kind in rows.KINDS:
    x = batch_of(rng, batch, vocab, kind)
    allowed = rng.random((batch, vocab)) < 0.5
    for dtype in (jnp.float32, jnp.bfloat16):
      for hostile_rows in (False, True):
        raw = as_dtype(hostile(rng, x) if hostile_rows else x, dtype)
        for mask in (None, jnp.asarray(allowed), packed(allowed)):
          where = f"{kind} {jnp.dtype(dtype).name} {None if mask is None else mask.dtype} hostile={hostile_rows}"
          top = jnp.max(batched.clean(raw, mask), axis=-1)
          got = batched_normalisers(raw, mask, top)
          # The per-row definition, batched by vmap (cut's branch-free way): the same sums, bit for bit.
          want = per_row_normalisers_unmasked(raw) if mask is None else per_row_normalisers(raw, mask)
          np.testing.assert_array_equal(got, want, err_msg=where)
          np.testing.assert_array_equal(got, branch_free_normalisers(raw, mask, top), err_msg=where)
          np.testing.assert_array_equal(batched_normalisers(raw, mask), got, err_msg=where)
          # cut.log_normalisers sums row by row under lax.map when a row is
          # dirty or masked, and XLA:CPU orders a [V] sum differently from a
          # [B, V] one (and may round a log differently once fused into a
          # reduction): the same within rounding, not bit for bit.
          np.testing.assert_allclose(got, cut_normalisers(raw, mask, top), rtol=1e-6, atol=1e-6, err_msg=where)


# -- no branches, no loops ------------------------------------------------------------------------------------------


def primitives(jaxpr) -> set[str]:
  """Every primitive in a jaxpr and in the jaxprs inside its equations."""
  found = set()
  for eqn in jaxpr.eqns:
    found.add(eqn.primitive.name)
    for value in eqn.params.values():
      for sub in value if isinstance(value, list | tuple) else [value]:
        inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds a Jaxpr
        if hasattr(inner, "eqns"):
          found |= primitives(inner)
  return found


def programs(vocab: int):
  b = 3
  logits, weight = jnp.zeros((b, vocab)), jnp.zeros((b, vocab))
  packed = jnp.zeros((b, -(-vocab // 32)), jnp.int32)
  words = jnp.zeros((b, 2), jnp.uint32)
  return {
    "shortest_prefix mass": (batched.shortest_prefix, (logits, weight, jnp.zeros((b,)))),
    "shortest_prefix count": (
      batched.shortest_prefix,
      (logits, weight.astype(jnp.int32), jnp.zeros((b,), jnp.int32)),
    ),
    "race": (batched.race, (logits, words)),
    "greedy": (batched.greedy, (logits.astype(jnp.bfloat16), packed)),
    "greedy bool mask": (batched.greedy, (logits, jnp.zeros((b, vocab), bool))),
    "log_normalisers": (batched.log_normalisers, (logits, packed, jnp.zeros((b,)))),
  }


@pytest.mark.parametrize("vocab", [7, 4099])
def test_blocks_hold_no_branch_or_loop(vocab):
  for name, (fn, args) in programs(vocab).items():
    found = primitives(jax.make_jaxpr(fn)(*args).jaxpr)
    assert not found & {"while", "scan", "cond"}, (name, found & {"while", "scan", "cond"})
  # The check sees through nesting: it finds the per-row search's loops (a fori_loop traces as a scan).
  rows_of_nine = jnp.zeros((2, 9))
  assert "scan" in primitives(jax.make_jaxpr(per_row_prefix)(rows_of_nine, rows_of_nine, jnp.zeros(2)).jaxpr)


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_blocks_lower_for_accelerators(platform):
  for fn, args in programs(4099).values():
    assert jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
