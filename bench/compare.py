"""Two trees' ``pick`` on the benchmark's workloads, timed in one process, call by call in turn.

``python -m bench --quick`` run once per tree measures each tree in its own minutes, and a shared
machine drifts by 10-20% between them. Here each tree exports its workloads' compiled ``pick``
(``jax.export``, in a process of its own, with its own ``jsample`` and ``bench.workloads``), and this
process loads both and alternates their calls, so both see the same machine. It also says whether the
two trees drew the same tokens.

  python -m bench.compare 78d82de                  # that commit against the working tree
  python -m bench.compare 78d82de HEAD --reps 41 --only real:e,flat:c

A revision is checked out in a temporary git worktree beside a link to the shared reference folder,
so that older trees find the real rows too. Each tree needs ``bench.workloads`` with ``workloads(batch)``,
``rows(kind, batch, vocab)`` and ``inputs(work, logits)``; workloads one tree lacks are left out.
"""

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

ROOT = Path(__file__).resolve().parents[1]
BATCH, VOCAB = 64, 262144
KINDS = ("real", "flat")


def export_workloads(out: str, only: set[str]) -> None:
  """In the tree being measured: every workload's ``pick`` (the token only), serialized, with its inputs."""
  from bench import workloads

  found = {}
  for kind in KINDS:
    logits = None
    for work in workloads.workloads(BATCH):
      if only and f"{kind}:{work.label}" not in only:
        continue
      logits = workloads.rows(kind, BATCH, VOCAB) if logits is None else logits
      state, mask = workloads.inputs(work, logits)
      leaves, tree = jax.tree.flatten(state)
      # Keys cannot be exported as arguments: they travel as their bits and are wrapped again inside.
      impls = [
        jax.random.key_impl(x) if jnp.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key) else None for x in leaves
      ]
      leaves = [x if impl is None else jax.random.key_data(x) for x, impl in zip(leaves, impls, strict=True)]

      def pick(x, leaves, mask=None, tree=tree, impls=impls, sampler=work.sampler):
        keyed = [v if i is None else jax.random.wrap_key_data(v, impl=i) for v, i in zip(leaves, impls, strict=True)]
        state = jax.tree.unflatten(tree, keyed)
        return (sampler.pick(x, state) if mask is None else sampler.pick(x, state, mask))[0]

      args = (logits, leaves) if mask is None else (logits, leaves, mask)
      shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype), args)
      found[(kind, work.label)] = (export.export(jax.jit(pick))(*shapes).serialize(), jax.tree.map(np.asarray, args))
  Path(out).write_bytes(pickle.dumps(found))


def exported(revision: str | None, only: set[str], scratch: Path) -> dict:
  """``revision``'s exported workloads (None: the working tree), from a process that imports that tree's
  ``jsample`` and ``bench`` (this file runs there as a script, so an older tree needs no copy of it)."""
  tree = ROOT
  if revision is not None:
    tree = scratch / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), revision], check=True)
  out = scratch / f"{revision or 'working-tree'}.pkl".replace("/", "_")
  command = [sys.executable, __file__, "--export", str(out), "--only", ",".join(sorted(only))]
  try:
    subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
  finally:
    if revision is not None:
      subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
  return pickle.loads(out.read_bytes())


def interleaved(before: dict, after: dict, reps: int) -> list[dict]:
  """Median ms of each workload both trees have, their calls alternated (the order flips each round)."""
  keys = [key for key in after if key in before]
  programs = {}
  for name, found in (("before", before), ("after", after)):
    for key in keys:
      blob, args = found[key]
      call = jax.jit(export.deserialize(blob).call)
      args = jax.device_put(args)
      programs[name, key] = call, args, np.asarray(jax.block_until_ready(call(*args)))
  times: dict = {key: [] for key in programs}
  for round_ in range(reps):
    for key in keys:
      for name in ("before", "after")[:: 1 if round_ % 2 == 0 else -1]:
        call, args, _ = programs[name, key]
        start = time.perf_counter()
        jax.block_until_ready(call(*args))
        times[name, key].append(time.perf_counter() - start)
  rows = []
  for key in keys:
    old, new = times["before", key], times["after", key]
    rows.append(
      dict(
        kind=key[0],
        label=key[1],
        before_ms=statistics.median(old) * 1e3,
        after_ms=statistics.median(new) * 1e3,
        after_faster=sum(b < a for a, b in zip(old, new, strict=True)),
        reps=reps,
        same_tokens=bool(np.array_equal(programs["before", key][2], programs["after", key][2])),
      )
    )
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("before", nargs="?", help="a git revision")
  parser.add_argument("after", nargs="?", help="a git revision (default: the working tree)")
  parser.add_argument("--reps", type=int, default=21, help="calls of each program (default 21)")
  parser.add_argument("--only", default="", help="kind:label pairs, such as real:e,flat:c (default: all)")
  parser.add_argument("--export", help=argparse.SUPPRESS)  # inside a tree's own process
  args = parser.parse_args()
  only = {pair for pair in args.only.split(",") if pair}
  if args.export:
    export_workloads(args.export, only)
    return
  if args.before is None:
    parser.error("name the revision to compare against")
  with tempfile.TemporaryDirectory() as scratch:
    shared = ROOT.parent / "shared"
    if shared.is_dir():  # older trees look for the real rows in ../shared beside themselves
      (Path(scratch) / "shared").symlink_to(shared)
    before = exported(args.before, only, Path(scratch))
    after = exported(args.after, only, Path(scratch))
  rows = interleaved(before, after, args.reps)
  from jsample._timing import seconds  # this tree's; an exporting process may have an older jsample

  floor = jax.jit(lambda x: jnp.max(x, axis=-1))
  x = jnp.asarray(next(iter(after.values()))[1][0])
  print(
    f"{args.before} -> {args.after or 'working tree'}, B {BATCH}, V {VOCAB}, float32, {jax.devices()[0].platform}; "
    f"read floor {seconds(floor, x) * 1e3:.1f} ms; medians of {args.reps} calls, alternated"
  )
  print("| rows | workload | before, ms | after, ms | after / before | after faster in | same tokens |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['kind']} | ({r['label']}) | {r['before_ms']:.1f} | {r['after_ms']:.1f} | "
      f"{r['after_ms'] / r['before_ms']:.2f} | {r['after_faster']}/{r['reps']} | {r['same_tokens']} |"
    )


if __name__ == "__main__":
  main()
