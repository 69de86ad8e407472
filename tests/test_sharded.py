"""jsample.sharded: vocabulary- (and batch-) sharded sampling gives single-device pick's tokens.

The checks need 8 devices, so they run in one child process with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX starts;
the rest of the suite keeps its one device. The child compiles one program per
mesh shape and runs several seeds, settings and masks through each.
"""

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))  # (batch, vocab) devices
V, B = 4096, 8
FLAT = 5  # the row whose nucleus lies beyond the candidates in the first scenario
COLLECTIVES = {"all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter", "collective-broadcast"}


def _scenarios(np, jnp, sampler, **extra):
  """``(logits [B, V], state, packed mask or all-allowed)`` alike in shape, differing in everything else;
  ``extra`` settings go to ``init`` beside the scenario's own."""
  rng = np.random.default_rng(0)
  out = []
  for scenario in range(3):
    # A model's rows: a few dozen plausible tokens well above a long tail.
    logits = rng.normal(size=(B, V)) * 2.0
    np.put_along_axis(logits, rng.integers(0, V, size=(B, 40)), rng.normal(size=(B, 40)) + 12.0, axis=1)
    if scenario == 0:
      logits[FLAT] = rng.normal(size=V) * 0.05  # top-k off, top-p 0.99 on a flat row: beyond the candidates
    logits[1, :7] = logits[1].max()  # ties at the top, across the first shard
    logits[2, 600:700] = np.nan if scenario == 1 else -np.inf
    prompts = rng.integers(0, V, size=(B, 24))
    # The penalised tokens among the best, so that the penalties move them (and, below 1, lift them).
    prompts[:, :8] = np.argsort(-np.nan_to_num(logits, nan=-np.inf), axis=1)[:, :8]
    settings = dict(
      top_k=[40, 0, 0, 1, 40, 0 if scenario == 0 else 7, 20, 0],
      top_p=[0.95, 0.9, 0.5, 1.0, 0.9, 0.99, 0.8, 0.95],
      min_p=[0.05, 0.0, 0.1, 0.0, 0.05, 0.0, 0.0, 0.2],
      temperature=[0.8, 1.0, 1.2, 1.0, 0.0, 1.5, 0.7, 1.0],
      repeat_penalty=[1.3, 1.0, 1.0, 1.1, 0.7 + 0.3 * scenario, 1.0, 0.5, 1.0],
      presence_penalty=0.5 * scenario,
      **extra,
    )
    state = sampler.init(seed=rng.integers(0, 2**31, size=B).tolist(), prompt=prompts, **settings)
    allowed = rng.random((B, V)) < (0.7 if scenario else 1.0)
    allowed[:, 0] = True
    allowed[3] = scenario != 2  # nothing allowed: token 0, flagged invalid, on both sides
    mask = jsample_pack(jnp, allowed)
    out.append((jnp.asarray(logits, jnp.float32), state, mask))
  return out


def jsample_pack(jnp, allowed):
  import jsample

  return jsample.pack_mask(jnp.asarray(allowed))


def child() -> None:
  """Runs in the 8-device child; prints one JSON line of what it found."""
  import re

  import jax
  import jax.numpy as jnp
  import numpy as np

  import jsample
  from jsample._src import paths, run

  jax.config.update("jax_numpy_rank_promotion", "raise")
  jax.config.update("jax_numpy_dtype_promotion", "strict")
  assert len(jax.devices()) == 8, jax.devices()
  report: dict = {"compared": 0, "mismatches": [], "expected": [], "state_errors": []}
  report.update({"all-gather": {}, "all-reduce": {}, "collectives": {}})

  def compare(case, sampler, shape, pick, scenarios, refs):
    for n, ((logits, state, mask), (ref, ref_state)) in enumerate(zip(scenarios, refs, strict=True)):
      token, after = pick(logits, state, mask)
      token, ref = np.atleast_1d(np.asarray(token)), np.atleast_1d(np.asarray(ref))
      where = [case, list(shape), n]
      report["compared"] += len(token)
      report["mismatches"] += [where + [int(i)] for i in np.flatnonzero(token != ref)]
      # Every row advances as on one device: its window, position and stages' state.
      for name in ("window", "position"):
        got, want = (np.asarray(getattr(s, name)).reshape(len(token), -1) for s in (after, ref_state))
        report["state_errors"] += [where + [name, int(i)] for i in np.flatnonzero(np.any(got != want, axis=1))]
      for got, want in zip(jax.tree.leaves(after.stages), jax.tree.leaves(ref_state.stages), strict=True):
        if not np.allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6, equal_nan=True):
          report["state_errors"].append(where + ["stages"])

  def run_case(case, sampler, meshes, scenarios, undecidable):
    """``undecidable``: per scenario, the rows one device sends to its full-vocabulary path."""
    single = jax.jit(sampler.pick)
    refs = [single(*args) for args in scenarios]
    for shape in meshes:
      report["expected"] += [[case, list(shape), n, i] for n, rows in enumerate(undecidable) for i in rows]
      mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), ("b", "v"))
      # One compiled program per mesh serves every scenario (and shows its collectives).
      pick = jax.jit(jsample.sharded(sampler, mesh, vocab_axis="v", batch_axis="b")).lower(*scenarios[0]).compile()
      text = pick.as_text()
      for op in ("all-gather", "all-reduce"):  # the shapes each returns (one, or a tuple of several)
        results = re.findall(rf"= (.*?) {op}(?:-start)?\(", text)
        report[op][f"{case} {shape}"] = sorted({s for r in results for s in re.findall(r"\w+\[([\d,]*)\]", r)})
      ops = {op.removesuffix("-start").removesuffix("-done") for op in re.findall(r" ([a-z][a-z-]*)\(", text)}
      report["collectives"][f"{case} {shape}"] = sorted(ops & COLLECTIVES)
      compare(case, sampler, shape, pick, scenarios, refs)

  # A short chain on every mesh shape; llama.cpp's whole chain, under the accelerator strategy, on one.
  small = jsample.chain(
    jsample.logit_bias(),
    jsample.penalties(),
    jsample.top_k(40),
    jsample.top_p(0.95),
    jsample.min_p(0.05),
    jsample.temperature(0.8),
  )
  scenarios = _scenarios(np, jnp, small)
  decidable = jax.jit(functools.partial(_decidable, run, paths, small))
  undecidable = [np.flatnonzero(~np.asarray(decidable(*args))).tolist() for args in scenarios]
  run_case("chain", small, MESHES, scenarios, undecidable)
  # llama.cpp's whole chain, with mirostat v2 and v1 (and their state) on two rows.
  llama = jsample.llama_cpp(strategy="accelerator")
  scenarios = _scenarios(np, jnp, llama, mirostat=[2, 0, 0, 0, 0, 0, 1, 0])
  decidable = jax.jit(functools.partial(_decidable, run, paths, llama))
  undecidable = [np.flatnonzero(~np.asarray(decidable(*args))).tolist() for args in scenarios]
  run_case("llama_cpp", llama, ((2, 4),), scenarios, undecidable)
  # One row [V] whose shards (V / 8 = 500) split the packed mask's words: unpacked first.
  rows = [(logits[0, :4000], state, mask) for logits, state, mask in scenarios]
  one = [(x, jax.tree.map(lambda a: a[0], st), jsample.unpack_mask(m, V)[0, :4000]) for x, st, m in rows]
  one = [(x, st, jsample.pack_mask(m)) for x, st, m in one]
  run_case("one row", small, ((1, 8),), one, [[] for _ in one])
  print("REPORT " + json.dumps(report))


def _decidable(run, paths, sampler, logits, state, mask):
  """The rows one device decides on its candidates, without its full-vocabulary path."""
  (raw, mask), rows, _, plan = run.prepare(sampler, logits, state, {"mask": mask})
  return paths.candidates(sampler.stages, sampler.budget, raw, mask, rows, plan).settle()[1]


@pytest.fixture(scope="module")
def report():
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()  # conftest's too
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  root = Path(__file__).resolve().parents[1]
  env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
  done = subprocess.run(
    [sys.executable, "-c", "import tests.test_sharded as t; t.child()"],
    cwd=root,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-4000:]
  line = next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))
  return json.loads(line[len("REPORT ") :])


def test_tokens_equal_single_device_pick(report):
  assert report["mismatches"] == []
  assert report["compared"] == (len(MESHES) + 1) * 3 * B + 3  # the chain on every mesh, llama.cpp's on one, one row


def test_rows_beyond_the_candidates_take_the_full_path(report):
  """The rows one device sends to its full-vocabulary path are among those compared: the flat row on every
  mesh, and rows of other kinds beside it."""
  assert all(["chain", list(shape), 0, FLAT] in report["expected"] for shape in MESHES)
  assert len({(n, row) for _, _, n, row in report["expected"]}) > 1, report["expected"]


def test_every_row_advances_as_on_one_device(report):
  assert report["state_errors"] == []


def test_only_candidates_and_reductions_cross_devices(report):
  """The compiled program gathers candidates, ``O(K × shards)`` per row, and all-reduces per-row values of
  the full path; it never moves a ``[B, V]`` row."""
  for mesh, ops in report["collectives"].items():
    assert set(ops) <= {"all-gather", "all-reduce"}, (mesh, ops)
  for mesh, shapes in report["all-gather"].items():
    if not mesh.endswith("(8, 1)"):
      assert shapes, mesh  # the vocabulary shards do exchange their candidates
    # Per row, at most 8 shards of K + m <= 2K = 256 candidates; in llama.cpp's chain also mirostat v1's full
    # path, which takes its 100 best chunks of 32 logits (3200, whatever V is). A row is V = 4096 (4000) wide.
    most = 3200 if mesh.startswith("llama_cpp") else 8 * 256
    for shape in shapes:
      dims = [int(d) for d in shape.split(",") if d]
      assert math.prod(dims[1:]) <= most < 4000, (mesh, shape)
  for mesh, shapes in report["all-reduce"].items():
    for shape in shapes:
      dims = [int(d) for d in shape.split(",") if d]
      assert dims[-1:] != [V // 8] and all(d < 4000 for d in dims), (mesh, shape)  # per-row values, not rows


def test_mesh_axes_are_checked():
  import jax
  import numpy as np

  import jsample

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("b", "v"))
  sampler = jsample.llama_cpp()
  with pytest.raises(ValueError, match="vocab_axis"):
    jsample.sharded(sampler, mesh, vocab_axis="x")
  with pytest.raises(ValueError, match="batch_axis"):
    jsample.sharded(sampler, mesh, vocab_axis="v", batch_axis="x")
  with pytest.raises(ValueError, match="batch_axis"):
    jsample.sharded(sampler, mesh, vocab_axis="v", batch_axis="v")
