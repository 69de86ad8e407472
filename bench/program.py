"""``python -m bench.program``: how large each recipe's ``pick`` is, and what it costs to compile.

For each recipe and strategy, at ``B = 8``, ``V = 262144``, float32 logits and the recipe's default settings:

- jaxpr equations, those inside branches and loop bodies included;
- HLO instructions of the optimised program XLA compiles;
- trace + compile seconds, the best of ``--repeats`` with JAX's caches cleared before each;
- XLA's bytes accessed over the logits' bytes: its static count, which adds up every branch of every
  conditional and counts a loop's body once (the searches' 32 passes as one), so it is a static size of the
  program rather than the bytes a call reads;
- ``cond`` s in the program, the conditionals that cost a host round trip each on a GPU.

Then the jaxpr equations by the jsample module that wrote them (the innermost jsample frame of each
equation's traceback): the stages and the machinery that make the program large.

The table goes to stdout and, as markdown, to ``bench/results/program-<backend>.md``.

Examples:
  python -m bench.program
  python -m bench.program --recipes gemma --strategies cpu --repeats 1
"""

import argparse
import collections
import platform
import time
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

import jsample

B, V = 8, 262144
RECIPES = {"gemma": jsample.gemma, "vllm": jsample.vllm, "hf": jsample.hf, "llama_cpp": jsample.llama_cpp}
STRATEGIES = ("cpu", "accelerator")
PACKAGE = Path(jsample.__file__).parent
RESULTS = Path(__file__).parent / "results"


def equations(jaxpr) -> list:
  """Every equation of ``jaxpr``, those of its branches and loop bodies included."""
  found = []
  for eqn in jaxpr.eqns:
    found.append(eqn)
    for value in eqn.params.values():
      for sub in value if isinstance(value, list | tuple) else [value]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          found += equations(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          found += equations(sub)
  return found


def author(eqn) -> str:
  """The jsample module (``stages/top_k``, ``kernels/cut``, ``run``) whose code wrote ``eqn``: the innermost
  frame of its traceback inside the package."""
  traceback = eqn.source_info.traceback
  for frame in traceback.frames if traceback is not None else ():
    path = Path(frame.file_name)
    if PACKAGE in path.parents:
      parts = path.relative_to(PACKAGE).with_suffix("").parts
      return "/".join(parts[1:] if parts[0] == "_src" else parts)
  return "(no jsample frame)"


def hlo_instructions(text: str) -> int:
  """Instructions in an HLO module's text: the lines that assign a value (``%x = ...`` or ``x = ...``)."""
  return sum(1 for line in text.splitlines() if " = " in line and not line.lstrip().startswith(("HloModule", "//")))


def measure(recipe: str, strategy: str, repeats: int, batch: int = B, vocab: int = V) -> dict:
  """One recipe and strategy's program: sizes, compile seconds, bytes accessed, conditionals and authors."""
  sampler = RECIPES[recipe](strategy=strategy)
  logits = jax.ShapeDtypeStruct((batch, vocab), jnp.float32)
  state = sampler.init(seed=np.arange(batch))
  jaxpr = jax.make_jaxpr(sampler.pick)(logits, state).jaxpr
  every = equations(jaxpr)
  times, compiled = [], None
  for _ in range(repeats):
    jax.clear_caches()
    start = time.perf_counter()
    compiled = jax.jit(sampler.pick).lower(logits, state).compile()
    times.append(time.perf_counter() - start)
  assert compiled is not None
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return dict(
    recipe=recipe,
    strategy=strategy,
    equations=len(every),
    hlo=hlo_instructions(compiled.as_text()),
    seconds=min(times),
    bytes_over_logits=cost["bytes accessed"] / (batch * vocab * 4),
    conds=sum(eqn.primitive.name == "cond" for eqn in every),
    authors=collections.Counter(author(eqn) for eqn in every),
  )


def table(rows: list[dict]) -> str:
  """The measurements as a markdown table."""
  lines = [
    "| recipe | strategy | jaxpr equations | HLO instructions | trace + compile | bytes accessed / logits' bytes "
    "| conds |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| `{r['recipe']}()` | {r['strategy']} | {r['equations']:,} | {r['hlo']:,} | {r['seconds']:.1f} s "
      f"| {r['bytes_over_logits']:,.0f}x | {r['conds']} |"
    )
  return "\n".join(lines)


def authors_table(rows: list[dict], top: int) -> str:
  """The ``top`` modules that write the most equations, per program."""
  names = collections.Counter()
  for r in rows:
    names.update(r["authors"])
  modules = [name for name, _ in names.most_common(top)]
  head = "| module | " + " | ".join(f"{r['recipe']} {r['strategy']}" for r in rows) + " |"
  lines = [head, "|---" * (len(rows) + 1) + "|"]
  for module in modules:
    lines.append(f"| {module} | " + " | ".join(f"{r['authors'].get(module, 0):,}" for r in rows) + " |")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m bench.program", description=__doc__.split("\n\n")[0])
  p.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=list(RECIPES))
  p.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
  p.add_argument("--repeats", type=int, default=2, help="compiles per program; the best counts (default: 2)")
  p.add_argument("--top", type=int, default=15, help="modules listed by equations written (default: 15)")
  p.add_argument(
    "--out", type=Path, default=None, help="the markdown file (default: bench/results/program-<backend>.md)"
  )
  args = p.parse_args(argv)
  rows = []
  for recipe in args.recipes:
    for strategy in args.strategies:
      rows.append(measure(recipe, strategy, args.repeats))
      print(table(rows[-1:]).splitlines()[-1], flush=True)
  backend = jax.default_backend()
  report = (
    f"# Program size: `pick` at B = {B}, V = {V}, float32, default settings\n\n"
    f"jax {jax.__version__}, backend {backend} ({jax.devices()[0].device_kind}), {platform.machine()}, "
    f"trace + compile the best of {args.repeats} with caches cleared. Bytes accessed is XLA's static count over "
    "every branch, a loop's body counted once.\n\n"
    + table(rows)
    + "\n\n## Jaxpr equations by the module that wrote them\n\n"
    + authors_table(rows, args.top)
    + "\n"
  )
  out = args.out or RESULTS / f"program-{backend}.md"
  out.write_text(report)
  print(f"\n{report}\nwritten to {out}")


if __name__ == "__main__":
  main()
