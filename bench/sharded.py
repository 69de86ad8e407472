"""Sharded sampling against gathering the rows first, and speculative verification against separate picks.

``python3 -m bench.sharded [--devices 8] [--reps 5] [--vocab 262144]``: the vocabulary split over 8 devices
(host devices on a CPU, made with ``--xla_force_host_platform_device_count`` before JAX starts; real chips
where there are 8).
Per workload it reports the median time of one call and the bytes the compiled program's collectives
return on each device (the partitioned program's shapes), summed over its collective instructions, each
counted once, a branch a step may skip included: an upper bound per step. The baseline is what engines do:
it reshards the logits from vocabulary shards to batch shards (each device gets whole rows, an all-to-all)
and runs ``sampler.pick`` there. Both are checked to draw the same tokens. The verification rows are on one
device. Results go to ``bench/results/sharded/<device>.json`` (a folder of their own: ``python -m bench``'s
runs, which the speed notebook reads, are the folder's own ``*.json``).
"""

import argparse
import os
import sys


def _devices_asked(argv: list[str]) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith("--devices="):
      return arg.split("=", 1)[1]
    if arg == "--devices" and i + 1 < len(argv):
      return argv[i + 1]
  return "8"


if __name__ == "__main__" and "jax" not in sys.modules:  # host devices must be made before JAX starts
  os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_devices_asked(sys.argv[1:])}")

import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jsample  # noqa: E402
from jsample._timing import seconds  # noqa: E402

_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "f64": 8, "s64": 8}
_COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(")


def collective_bytes(compiled) -> dict[str, int]:
  """Bytes each kind of collective returns, summed over the program's instructions of that kind."""
  out: dict[str, int] = {}
  for results, op in _COLLECTIVE.findall(compiled.as_text()):
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", results):
      size = int(np.prod([int(d) for d in dims.split(",") if d]))
      out[op] = out.get(op, 0) + size * _BYTES.get(dtype, 4)
  return out


def rows(batch: int, vocab: int, flat: bool, seed: int = 0) -> np.ndarray:
  """Model-like rows (a few dozen plausible tokens above a long tail), or flat ones."""
  rng = np.random.default_rng(seed)
  if flat:
    return (rng.normal(size=(batch, vocab)) * 0.05).astype(np.float32)
  logits = rng.normal(size=(batch, vocab)) * 2.0
  np.put_along_axis(logits, rng.integers(0, vocab, (batch, 40)), rng.normal(size=(batch, 40)) + 12.0, axis=1)
  return logits.astype(np.float32)


def compare(mesh, sampler, logits: np.ndarray, state, reps: int) -> dict:
  """The sharded pick against resharding to whole rows and picking, on the same rows."""
  by_vocab = NamedSharding(mesh, P(None, "v"))
  by_rows = NamedSharding(mesh, P("v", None))
  x = jax.device_put(jnp.asarray(logits), by_vocab)
  sharded = jax.jit(jsample.sharded(sampler, mesh, vocab_axis="v")).lower(x, state).compile()
  gathered = (
    jax.jit(lambda x, s: sampler.pick(jax.lax.with_sharding_constraint(x, by_rows), s)).lower(x, state).compile()
  )
  same = bool(np.array_equal(np.asarray(sharded(x, state)[0]), np.asarray(gathered(x, state)[0])))
  out = {"same_tokens": same}
  for name, program in (("sharded", sharded), ("gathered", gathered)):
    moved = collective_bytes(program)
    out[name] = {"ms": seconds(program, x, state, repeats=reps) * 1e3, "bytes": sum(moved.values()), "by_op": moved}
  return out


def verification(sampler, batch: int, vocab: int, length: int, reps: int) -> dict:
  """``verify`` of an L-token draft (the target's rows plus noise) against L separate picks, on one device."""
  rng = np.random.default_rng(1)
  target = np.stack([rows(batch, vocab, False, seed=10 + i) for i in range(length + 1)], axis=1)
  draft_logits = target[:, :length] + rng.normal(size=(batch, length, vocab)).astype(np.float32) * 0.3
  probs = np.asarray(jax.nn.softmax(jnp.asarray(draft_logits), axis=-1))
  state = sampler.init(seed=np.arange(batch))
  draft = np.stack(
    [np.asarray(jax.random.categorical(jax.random.key(i), jnp.asarray(draft_logits[:, i]))) for i in range(length)], 1
  )
  args = [jnp.asarray(a) for a in (draft, probs, target)]
  verify = jax.jit(sampler.verify)
  _, accepted, _ = verify(*args, state)
  pick = jax.jit(sampler.pick)
  steps = [jnp.asarray(target[:, i]) for i in range(length)]

  def picks(state):
    for x in steps:
      _, state = pick(x, state)
    return state

  return {
    "batch": batch,
    "length": length,
    "acceptance": float(np.mean(np.asarray(accepted)) / length),
    "verify_ms": seconds(verify, *args, state, repeats=reps) * 1e3,
    "picks_ms": seconds(picks, state, repeats=reps) * 1e3,
  }


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m bench.sharded", description=__doc__.splitlines()[0])
  p.add_argument("--devices", type=int, default=8, help="the vocabulary's shards (host devices on a CPU)")
  p.add_argument("--reps", type=int, default=5, help="timed calls per measurement")
  p.add_argument("--vocab", type=int, default=262144, help="V, split evenly over the devices")
  p.add_argument("--out", type=Path, default=Path("bench/results"))
  args = p.parse_args(argv)
  devices = jax.devices()[: args.devices]
  if len(devices) < args.devices:
    raise SystemExit(
      f"--devices {args.devices}: only {len(devices)} devices; on a CPU run it as python -m bench.sharded"
    )
  mesh = jax.sharding.Mesh(np.array(devices), ("v",))
  llama = jsample.llama_cpp()
  work = {
    "llama_cpp defaults, B=64": (llama, rows(64, args.vocab, False), {}),
    "top-k off, top-p .95, flat rows (full path), B=16": (llama, rows(16, args.vocab, True), dict(top_k=0)),
  }
  results = {}
  for name, (sampler, logits, settings) in work.items():
    state = sampler.init(seed=np.arange(len(logits)), **settings)
    results[name] = r = compare(mesh, sampler, logits, state, args.reps)
    s, g = r["sharded"], r["gathered"]
    print(
      f"{name:<52} sharded {s['ms']:8.1f} ms {s['bytes'] / 1e6:7.2f} MB | reshard, then pick {g['ms']:8.1f} ms "
      f"{g['bytes'] / 1e6:7.2f} MB | same tokens: {r['same_tokens']}",
      flush=True,
    )
  spec = verification(llama, 64, args.vocab, 4, args.reps)
  print(
    f"verify L={spec['length']} B={spec['batch']}: acceptance {spec['acceptance']:.3f}, {spec['verify_ms']:.1f} ms "
    f"against {spec['picks_ms']:.1f} ms for {spec['length']} picks"
  )
  kind = devices[0].device_kind
  meta = dict(
    date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
    jax=jax.__version__,
    devices=f"{len(devices)} x {kind}",
    vocab=args.vocab,
    note="bytes: per device, the summed results of the compiled program's collectives, each instruction once",
  )
  slug = "cpu" if devices[0].platform == "cpu" else re.sub(r"\W+", "-", kind.lower())
  path = args.out / "sharded" / f"{slug}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"meta": meta, "sharded": results, "verify": spec}, indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
