"""``python -m bench.backends``: the same tokens on every backend.

Draws tokens from the recorded Gemma 3 270M rows (``tests/data``) with each recipe and strategy, under a few
settings (the recipe's defaults, vLLM's OpenAI shape with top-k off, greedy) and several seeds and positions,
on JAX's default backend. ``--save F.npz`` writes the tokens, log-probabilities and ``valid`` flags;
``--against F.npz`` compares them with a file written on another backend (a CPU run, say, beside a GPU run):
tokens and flags must match exactly, log-probabilities to float32 rounding.

Examples:
  python -m bench.backends --save cpu.npz                   # on a CPU
  python -m bench.backends --save gpu.npz --against cpu.npz # on a GPU, against the CPU's tokens
"""

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jsample
from bench import workloads

RECIPES = {"gemma": jsample.gemma, "vllm": jsample.vllm, "hf": jsample.hf, "llama_cpp": jsample.llama_cpp}
STRATEGIES = ("cpu", "accelerator")
SETTINGS = {
  "defaults": {},
  "openai": {"temperature": 1.0, "top_k": 0, "top_p": 0.9},  # the rare path of the accelerator strategy
  "greedy": {"temperature": 0.0},
}
STEPS = 4  # positions per setting, each with its own seeds
LOGPROB_TOLERANCE = 1e-4


def draw(recipe: str, strategy: str, rows: np.ndarray) -> dict[str, np.ndarray]:
  """``{f"{recipe}/{strategy}/{setting}/{field}": [STEPS, B]}`` for every setting, on the default backend."""
  sampler = RECIPES[recipe](strategy=strategy)
  pick = jax.jit(sampler.pick_with_info)
  logits = jnp.asarray(rows)
  out = {}
  for name, settings in SETTINGS.items():
    state = sampler.init(seed=np.arange(len(rows)) * 31 + 7, **settings)
    fields = {"token": [], "logprob": [], "valid": []}
    for _ in range(STEPS):
      info, state = pick(logits, state)
      for field, values in fields.items():
        values.append(np.asarray(getattr(info, field)))
    for field, values in fields.items():
      out[f"{recipe}/{strategy}/{name}/{field}"] = np.stack(values)
  return out


def compare(mine: dict, theirs: dict) -> list[str]:
  """One line per recipe, strategy and setting: equal, or what differs."""
  lines = []
  for key in sorted(k for k in mine if k.endswith("/token")):
    case = key.removesuffix("/token")
    if key not in theirs:
      lines.append(f"{case}: not in the other file")
      continue
    moved = int(np.sum(mine[key] != theirs[key]))
    flags = int(np.sum(mine[f"{case}/valid"] != theirs[f"{case}/valid"]))
    a, b = mine[f"{case}/logprob"], theirs[f"{case}/logprob"]
    finite = np.isfinite(a) & np.isfinite(b)
    gap = float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
    same_inf = bool(np.array_equal(np.isfinite(a), np.isfinite(b)))
    ok = moved == 0 and flags == 0 and same_inf and gap <= LOGPROB_TOLERANCE
    lines.append(
      f"{'equal' if ok else 'DIFFERS'}  {case}: {moved} of {mine[key].size} tokens moved, "
      f"{flags} valid flags, largest logprob gap {gap:.2e}"
    )
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m bench.backends", description=__doc__.split("\n\n")[0])
  p.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES))
  p.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
  p.add_argument("--save", type=Path, help="write the tokens here (.npz)")
  p.add_argument("--against", type=Path, help="compare with tokens another backend wrote (.npz)")
  args = p.parse_args(argv)

  rows = workloads.real_rows()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}: {len(rows)} real rows, V = {rows.shape[1]}")
  mine = {}
  for recipe in args.recipes:
    for strategy in args.strategies:
      start = time.perf_counter()
      mine.update(draw(recipe, strategy, rows))
      print(f"{recipe} {strategy}: drawn in {time.perf_counter() - start:.1f} s (compile included)", flush=True)
  if args.save:
    np.savez_compressed(args.save, **mine)
  lines = []
  if set(args.strategies) == set(STRATEGIES):  # the strategies against each other, on this backend
    accelerator = {k.replace("/accelerator/", "/cpu/"): v for k, v in mine.items() if "/accelerator/" in k}
    lines += [f"{line} (cpu strategy against accelerator)" for line in compare(accelerator, mine)]
  if args.against is not None:
    with np.load(args.against) as data:
      lines += [f"{line} (against {args.against.name})" for line in compare(mine, dict(data))]
  print("\n".join(lines))
  return int(any(not line.startswith("equal") for line in lines))


if __name__ == "__main__":
  sys.exit(main())
