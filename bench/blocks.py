"""``python -m bench.blocks``: the batched blocks beside the per-row functions they stand in for.

Each line is one jitted call on ``[B, V]`` real rows (peaked rows when the real
ones are missing or ``--rows`` says so), as a ratio to the read floor
``jnp.max(logits, axis=-1)`` measured in the same run. "per row" is what the
sampler runs today (``lax.map`` over rows); "vmap" is the per-row function
batched by ``jax.vmap``, the reference the blocks are tested against.
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jsample
from bench import batched, workloads
from bench.run import timed
from jsample._src.kernels import cut, noise, search
from jsample._src.kernels.rowmath import logsumexp


def cases(logits: jax.Array) -> dict:
  """name -> (function, args), every function taking the batch whole."""
  batch, vocab = logits.shape
  clean = jax.jit(jax.vmap(cut.clean))(logits)
  weight = jax.jit(lambda x: jnp.exp(x - jax.vmap(logsumexp)(x)[:, None]))(clean)
  count = (clean > -jnp.inf).astype(jnp.int32)
  p = jnp.full((batch,), 0.9, jnp.float32)
  k = jnp.full((batch,), 64, jnp.int32)
  step_bits = jax.vmap(noise.step_bits)(jax.random.split(jax.random.key(0), batch), jnp.zeros(batch, jnp.int32))
  top = jnp.max(clean, axis=-1)
  per_row = lambda f: lambda *a: lax.map(lambda r: f(*r), a)  # noqa: E731
  greedy = jsample.chain(jsample.temperature(0.0))
  state = greedy.init(seed=np.arange(batch))
  return {
    "floor jnp.max": (lambda x: jnp.max(x, axis=-1), (logits,)),
    "jnp.argmax": (lambda x: jnp.argmax(x, axis=-1), (logits,)),
    "top-p search, per row": (per_row(search.shortest_prefix), (clean, weight, p)),
    "top-p search, vmap": (jax.vmap(search.shortest_prefix), (clean, weight, p)),
    **{
      f"top-p search, batched {b} bits": (functools.partial(batched.shortest_prefix, bits=b), (clean, weight, p))
      for b in (1, 2, 4)
    },
    "top-k search, per row": (per_row(search.shortest_prefix), (clean, count, k)),
    "top-k search, vmap": (jax.vmap(search.shortest_prefix), (clean, count, k)),
    **{
      f"top-k search, batched {b} bits": (functools.partial(batched.shortest_prefix, bits=b), (clean, count, k))
      for b in (1, 2, 4)
    },
    "race, per row (race_row)": (per_row(noise.race_row), (clean, step_bits)),
    "race, vmap race_row": (jax.vmap(noise.race_row), (clean, step_bits)),
    "race, batched": (batched.race, (clean, step_bits)),
    "race, batched, noise per id": (batched.race_plain, (clean, step_bits)),
    "greedy, the chain's pick": (lambda x, s: greedy.pick(x, s)[0], (logits, state)),
    "greedy, batched": (lambda x: batched.greedy(x, None), (logits,)),
    "log-normalisers, cut": (lambda x, t: cut.log_normalisers(x, None, t), (logits, top)),
    "log-normalisers, cut, a dirty row": (
      lambda x, t: cut.log_normalisers(x.at[0, 0].set(jnp.nan), None, t),
      (logits, top),
    ),
    "log-normalisers, batched": (lambda x, t: batched.log_normalisers(x, None, t), (logits, top)),
  }


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m bench.blocks", description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--vocab", type=int, default=262144)
  p.add_argument("--rows", choices=("real", "peaked"), default="real")
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--only", default="", help="comma-separated substrings: time the matching cases only")
  args = p.parse_args(argv)
  try:
    host = workloads.rows(args.rows, args.batch, args.vocab)
  except (FileNotFoundError, ValueError):
    host = workloads.rows("peaked", args.batch, args.vocab)
  logits = jnp.asarray(host)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B={args.batch} V={args.vocab}")
  floor = timed(lambda x: jnp.max(x, axis=-1), logits, reps=3 * args.reps)[0]
  print(f"{'block':<40} {'ms':>9} {'x floor':>8}")
  wanted = [w for w in args.only.split(",") if w]
  for name, (fn, fargs) in cases(logits).items():
    if wanted and not any(w in name for w in wanted):
      continue
    seconds = timed(fn, *fargs, reps=args.reps)[0]
    print(f"{name:<40} {seconds * 1e3:>9.2f} {seconds / floor:>8.1f}", flush=True)


if __name__ == "__main__":
  main()
