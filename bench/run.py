"""``python -m bench``: jsample's workloads and other engines' algorithms, timed side by side.

Every time is the median of several calls of a jitted function on arrays
already on the device, reported as a ratio to the *read floor*:
``jnp.max(logits, axis=-1)`` on the same array, measured in the same run.
Beside the time per call, the time per step of ``--steps`` calls inside one
jitted ``lax.fori_loop`` (what a decode loop pays: one dispatch for many
steps), over the read floor timed the same way. XLA's temporary memory comes
from ``compiled.memory_analysis()``. PyTorch engines' samplers
(``bench/torch_peers.py``) join when ``torch`` is importable.
"""

import argparse
import datetime
import json
import platform
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jsample
from bench import baselines, torch_peers, workloads
from jsample._timing import seconds

# Issue 3's limits on CPU at V=262144, B=64, float32: ratio to the read floor, by workload.
TARGETS = {
  "a": 3.0,
  "d": 1.5,
  "b": 12.0,
  "c": 12.0,
  "g": 12.0,
}
FLAT_LIMIT = 60.0  # (b) and (c) on flat rows
RELATIVE_TO_A = {"e": 1.2, "f": 1.3, "h": 1.5, "i": 1.5}  # ratio to workload (a)'s time on the same rows
# The accelerator's limits (GPU or TPU backend) at V=262144, B=256, float32: ratio to the read floor.
ACCELERATOR_TARGETS = {"d": 1.2, "a": 4.0, "b": 6.0, "c": 30.0, "g": 3.5}
FASTER_THAN_VLLM = {"c": 3.0}  # vLLM's sort path over jsample's time, at least
MIXED_OVER_QUARTERS = 1.2  # (e) over its slowest quarter alone (e1..e4), at most
VMAP_OVER_BATCHED = 1.2  # (a) under jax.vmap(pick) over the batched call, at most (both strategies)
SINGLE_ROW_LIMIT = {"a": 2.5}  # at B=1, ratio to the B=1 read floor
BASELINE_SETTINGS = {  # temperature, top_k, top_p: the jsample workload each matches
  "c": (1.6, 0, 0.9),
  "g": (1.0, 0, 1.0),
  "k64": (1.0, 64, 0.95),
}
TORCH_SETTINGS = {  # temperature, top_k, top_p, min_p: the jsample workload each matches
  "a": (1.0, 64, 0.95, 0.05),
  "b": (1.0, 0, 0.95, 0.05),
  "c": (1.6, 0, 0.9, 0.0),
  "g": (1.0, 0, 1.0, 0.0),
}


def accelerated() -> bool:
  return jax.default_backend() in ("gpu", "tpu")


def timed(fn, *args, reps: int) -> tuple[float, int]:
  """(median seconds per call, XLA temporary bytes) of ``jax.jit(fn)(*args)``."""
  compiled = jax.jit(fn).lower(*args).compile()
  memory = compiled.memory_analysis()
  temp = int(getattr(memory, "temp_size_in_bytes", 0)) if memory is not None else 0
  return seconds(compiled, *args, repeats=reps), temp


def read_floor(logits, reps: int) -> float:
  return timed(lambda x: jnp.max(x, axis=-1), logits, reps=reps)[0]


def looped(step, logits, carry, *, steps: int, reps: int) -> float:
  """Median seconds per step of ``steps`` calls of ``step`` in one jitted ``lax.fori_loop``.

  ``step(i, logits, carry) -> (out [B], carry)``. Each step's logits depend on
  the step before (one entry per row, rewritten in place), as a decode loop's
  do: otherwise XLA hoists the work on the unchanging logits out of the loop.
  The loop's own copy of the logits, once per call, is part of the time.
  """

  def run(logits, carry):
    def body(i, c):
      logits, carry, total = c
      out, carry = step(i, logits, carry)
      out = out.astype(jnp.float32)
      logits = logits.at[:, 0].set(jnp.where(out == -1.5, jnp.zeros((), logits.dtype), logits[:, 0]))
      return logits, carry, total + jnp.sum(out)

    return lax.fori_loop(0, steps, body, (logits, carry, jnp.float32(0)))[2]

  return timed(run, logits, carry, reps=reps)[0] / steps


def loop_floor(logits, *, steps: int, reps: int) -> float:
  return looped(lambda i, x, c: (jnp.max(x, axis=-1), c), logits, (), steps=steps, reps=reps)


def picks(sampler):
  """A loop step of a jsample sampler; the carry is ``(state, mask)``."""

  def step(i, logits, carry):
    state, mask = carry
    token, state = sampler.pick(logits, state, mask)
    return token, (state, mask)

  return step


def draws(sample):
  """A loop step of ``sample(key, logits)``; the carry is the key, folded with the step."""
  return lambda i, logits, key: (sample(jax.random.fold_in(key, i), logits), key)


def run_config(
  vocab,
  batch,
  dtype,
  kind,
  *,
  reps,
  with_baselines,
  with_sort,
  log,
  steps=0,
  looped_only=None,
  strategy=None,
  quarters=False,
) -> list[dict]:
  """Times every workload (and the baselines and PyTorch peers) on one batch of rows.

  ``steps > 0`` also times jsample and the JAX baselines per step of a ``steps``-long loop;
  ``looped_only``, a set of names, limits that to those names.
  """

  def in_loop(name):
    return steps > 0 and (looped_only is None or name in looped_only)

  host = workloads.rows(kind, batch, vocab)
  logits = jnp.asarray(host, dtype)
  floor = read_floor(logits, reps=3 * reps)
  floor_in_loop = loop_floor(logits, steps=steps, reps=reps) if steps else None
  common = dict(
    vocab=vocab,
    batch=batch,
    dtype=jnp.dtype(dtype).name,
    rows=kind,
    floor_ms=floor * 1e3,
    loop_floor_ms=floor_in_loop * 1e3 if steps else None,
  )
  logits_bytes = logits.size * logits.dtype.itemsize
  results = []

  def record(name, seconds, temp, loop=None, **extra):
    entry = dict(
      common,
      workload=name,
      ms=seconds * 1e3,
      ratio=seconds / floor,
      loop_ms=None if loop is None else loop * 1e3,
      loop_ratio=None if loop is None else loop / floor_in_loop,
      temp_bytes=temp,
      temp_vs_logits=temp / logits_bytes,
      **extra,
    )
    results.append(entry)
    log(entry)

  for work in workloads.workloads(batch, strategy=strategy, quarters=quarters):
    state, mask = workloads.inputs(work, host)
    seconds, temp = timed(work.sampler.pick, logits, state, mask, reps=reps)
    loop = looped(picks(work.sampler), logits, (state, mask), steps=steps, reps=reps) if in_loop(work.label) else None
    record(work.label, seconds, temp, loop, description=work.description)
    if work.label == "a":  # the same rows through jax.vmap(pick), one row per call: pick's own batching rule
      seconds, temp = timed(jax.vmap(work.sampler.pick), logits, state, mask, reps=reps)
      record("a:vmap", seconds, temp, None, description="(a) under jax.vmap(sampler.pick)")

  if with_baselines:
    key = jax.random.key(0)
    opts = {} if strategy is None else {"strategy": strategy}
    for label, (t, k, p) in BASELINE_SETTINGS.items():
      if label == "k64":  # jsample itself on the setting every baseline handles
        sampler = jsample.hf(temperature=t, top_k=k, top_p=p, **opts)
        state = sampler.init(seed=np.arange(batch))
        seconds, temp = timed(sampler.pick, logits, state, reps=reps)
        loop = looped(picks(sampler), logits, (state, None), steps=steps, reps=reps) if in_loop("k64") else None
        record("k64", seconds, temp, loop, description="jsample, temperature first, k 64, p .95")
      for base in baselines.BASELINES:
        if base.name == "lax.top_k" and k <= 0:
          continue  # it cannot run with top-k off
        if base.name == "full sort" and not (with_sort or label == "c"):
          continue  # a sort costs seconds per call: --quick sorts for (c) only
        runs = max(2, reps // 3) if base.name == "full sort" else reps
        sample = lambda key, x, b=base, t=t, k=k, p=p: b.sample(key, x, t, k, p)  # noqa: E731
        seconds, temp = timed(sample, key, logits, reps=runs)
        # A sort per step costs seconds on a CPU: its loop is timed only with the full grid's sorts.
        name = f"{label}:{base.name}"
        looping = in_loop(name) and (base.name != "full sort" or with_sort)
        loop = looped(draws(sample), logits, key, steps=steps, reps=runs) if looping else None
        record(name, seconds, temp, loop, description=base.description)
    if torch_peers.available():
      results += torch_config(host, common, floor, logits_bytes, reps=reps, log=log)
  return results


def torch_config(host, common, floor, logits_bytes, *, reps, log) -> list[dict]:
  """PyTorch's read floor and peers on the same rows, as ratios to the JAX read floor."""
  x = torch_peers.tensor(host, common["dtype"])
  where = f"torch {torch_peers.torch.__version__} on {torch_peers.device()}"
  timings = [("torch:amax", "PyTorch amax (its read floor)", torch_peers.floor(x, repeats=3 * reps))]
  for label, (t, k, p, min_p) in TORCH_SETTINGS.items():
    pure = k <= 0 and p >= 1 and min_p <= 0
    for peer in torch_peers.PEERS:
      if (peer.needs_top_k and k <= 0) or (peer.name == "softmax race" and not pure):
        continue
      seconds = torch_peers.seconds(peer.sample, x, t, k, p, min_p, repeats=reps)
      timings.append((f"{label}:torch {peer.name}", peer.description, seconds))
  out = []
  for name, description, seconds in timings:
    entry = dict(
      common,
      workload=name,
      ms=seconds * 1e3,
      ratio=seconds / floor,
      loop_ms=None,
      loop_ratio=None,
      temp_bytes=0,
      temp_vs_logits=0.0,
      description=f"{description}; {where}",
    )
    out.append(entry)
    log(entry)
  return out


def targets(results: list[dict], accelerator: bool | None = None) -> list[tuple[str, str, bool]]:
  """Each target: (what, measured, met). The accelerator's table on a GPU or TPU backend, else the CPU's."""
  if accelerator is None:
    accelerator = accelerated()
  return accelerator_targets(results) if accelerator else cpu_targets(results)


def _loop_note(r: dict) -> str:
  return "" if r.get("loop_ratio") is None else f" (in a loop {r['loop_ratio']:.1f}x)"


def cpu_targets(results: list[dict]) -> list[tuple[str, str, bool]]:
  """Each target of issue 3 at V=262144, B=64, float32: (what, measured, met)."""
  at = [r for r in results if (r["vocab"], r["batch"], r["dtype"]) == (262144, 64, "float32")]
  ratio = {(r["rows"], r["workload"]): r["ratio"] for r in at}
  out = []
  for kind in ("real", "peaked", "flat"):
    for label, limit in TARGETS.items():
      if (kind, label) not in ratio:
        continue
      limit = FLAT_LIMIT if kind == "flat" and label in ("b", "c") else limit
      value = ratio[kind, label]
      out.append((f"({label}) {kind} <= {limit}x", f"{value:.1f}x", value <= limit))
    for label, limit in RELATIVE_TO_A.items():
      if (kind, label) in ratio and (kind, "a") in ratio:
        value = ratio[kind, label] / ratio[kind, "a"]
        out.append((f"({label}) {kind} <= {limit}x (a)", f"{value:.2f}x (a)", value <= limit))
    for label in ("c", "g"):
      if (kind, f"{label}:full sort") in ratio and (kind, label) in ratio:
        value = ratio[kind, f"{label}:full sort"] / ratio[kind, label]
        out.append((f"({label}) {kind} >= 100x faster than full sort", f"{value:.0f}x", value >= 100))
    if (kind, "a:vmap") in ratio and (kind, "a") in ratio:
      value = ratio[kind, "a:vmap"] / ratio[kind, "a"]
      out.append((f"(a) {kind} vmapped <= {VMAP_OVER_BATCHED}x batched", f"{value:.2f}x", value <= VMAP_OVER_BATCHED))
  for r in at:
    if r["workload"] == "a":
      out.append((f"(a) memory {r['rows']} <= 1x logits", f"{r['temp_vs_logits']:.2f}x", r["temp_vs_logits"] <= 1))
    if r["workload"] == "c:full sort":
      out.append((f"full sort memory {r['rows']} (reported)", f"{r['temp_vs_logits']:.2f}x", True))
  return out


def accelerator_targets(results: list[dict]) -> list[tuple[str, str, bool]]:
  """The accelerator's targets at V=262144, float32: B=256, and the default chain at B=1."""
  out = []
  for batch, limits in ((256, ACCELERATOR_TARGETS), (1, SINGLE_ROW_LIMIT)):
    at = {
      (r["rows"], r["workload"]): r
      for r in results
      if (r["vocab"], r["batch"], r["dtype"]) == (262144, batch, "float32")
    }
    for kind in ("real", "peaked", "flat"):
      for label, limit in limits.items():
        if (kind, label) in at:
          r = at[kind, label]
          out.append(
            (f"({label}) {kind} B={batch} <= {limit}x", f"{r['ratio']:.1f}x{_loop_note(r)}", r["ratio"] <= limit)
          )
      if batch != 256:
        continue
      for label, factor in FASTER_THAN_VLLM.items():
        peer = (kind, f"{label}:torch vllm sort")
        if (kind, label) in at and peer in at:
          value = at[peer]["ratio"] / at[kind, label]["ratio"]
          out.append((f"({label}) {kind} B=256 >= {factor}x faster than vLLM sort", f"{value:.1f}x", value >= factor))
        elif (kind, label) in at:
          out.append((f"({label}) {kind} B=256 >= {factor}x faster than vLLM sort", "no torch", False))
      if (kind, "a:vmap") in at and (kind, "a") in at:
        value = at[kind, "a:vmap"]["ratio"] / at[kind, "a"]["ratio"]
        out.append(
          (f"(a) {kind} B=256 vmapped <= {VMAP_OVER_BATCHED}x batched", f"{value:.2f}x", value <= VMAP_OVER_BATCHED)
        )
      quarters = [at[kind, f"e{q}"]["ratio"] for q in range(1, 5) if (kind, f"e{q}") in at]
      if (kind, "e") in at and len(quarters) == 4:
        value = at[kind, "e"]["ratio"] / max(quarters)
        limit = MIXED_OVER_QUARTERS
        out.append((f"(e) {kind} B=256 <= {limit}x its slowest quarter", f"{value:.2f}x", value <= limit))
  return out


# The plot's names for the workloads (bench/workloads.py) and the baselines' settings, beside their letters.
SHORT_NAMES = {
  "a": "Gemma chain",
  "b": "llama.cpp chain, top-k off",
  "c": "temperature first, T 1.6",
  "d": "greedy",
  "e": "mixed batch",
  "f": "packed mask, 10% allowed",
  "g": "pure sampling",
  "h": "Gemma chain, W=1024",
  "i": "DRY and penalties, W=1024",
  "k64": "top-k 64, top-p .95",
}


def tick(label: str) -> str:
  """A bar's name: ``"c:full sort"`` -> ``"(c) temperature first, T 1.6: full sort"``."""
  workload, _, engine = label.partition(":")
  name = f"({workload}) {SHORT_NAMES[workload]}" if workload in SHORT_NAMES else workload
  return f"{name}: {engine}" if engine else name


def plot(results: list[dict], path: Path, batch: int = 64) -> bool:
  """A bar chart of the ratios at V=262144, float32, one batch size (needs matplotlib)."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  at = [r for r in results if (r["vocab"], r["batch"], r["dtype"]) == (262144, batch, "float32")]
  if not at:
    return False
  labels = list(dict.fromkeys(r["workload"] for r in at))
  kinds = list(dict.fromkeys(r["rows"] for r in at))
  fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(labels)), 6.5))
  width = 0.8 / max(len(kinds), 1)
  for i, kind in enumerate(kinds):
    ratio = {r["workload"]: r["ratio"] for r in at if r["rows"] == kind}
    xs = [j + i * width for j, label in enumerate(labels) if label in ratio]
    ax.bar(xs, [ratio[label] for label in labels if label in ratio], width, label=f"{kind} rows")
  ticks = [j + width * (len(kinds) - 1) / 2 for j in range(len(labels))]
  ax.set_xticks(ticks, [tick(label) for label in labels], rotation=60, ha="right")
  ax.set_yscale("log")
  ax.axhline(1.0, color="black", linewidth=0.8)
  ax.set_ylabel("time / read floor (jnp.max)")
  ax.set_title(f"jsample vs other engines' algorithms, V=262144, B={batch}, float32")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def _cpu_name() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def device_slug() -> str:
  """The device's name as it goes into a file name: ``cpu``, ``NVIDIA-H200``, ``TPU-v5-lite``."""
  return re.sub(r"[^A-Za-z0-9]+", "-", jax.devices()[0].device_kind).strip("-") or jax.default_backend()


def grid(quick: bool, accelerator: bool) -> list[tuple]:
  """``(vocab, batch, dtype, rows, with_baselines, with_quarters)`` of every configuration timed."""
  real = [(262144, batch, jnp.float32, "real", True, False) for batch in (1, 8, 64, 256)]
  if accelerator:  # the targets sit at B=256 (and B=1): time them even when quick
    real[3] = (262144, 256, jnp.float32, "real", True, True)
    if quick:
      return [real[3], real[0], real[2]]
  elif quick:
    return [(262144, 64, jnp.float32, "real", True, False), (262144, 64, jnp.float32, "flat", False, False)]
  configs = real + [(262144, 64, jnp.float32, kind, True, False) for kind in ("peaked", "flat")]
  for vocab in (32768, 131072, 262144):
    for batch in (1, 8, 64, 256):
      for dtype in (jnp.float32, jnp.bfloat16):
        if (vocab, batch, dtype) != (262144, 64, jnp.float32):
          configs.append((vocab, batch, dtype, "peaked", False, False))
  configs += [(262144, 256, jnp.bfloat16, "real", False, False), (262144, 64, jnp.bfloat16, "real", False, False)]
  return configs


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
  p.add_argument(
    "--quick",
    action="store_true",
    help="CPU: V=262144, B=64, float32, real and flat rows only; GPU/TPU: real rows at B=256, 1 and 64",
  )
  p.add_argument("--out", type=Path, default=Path("bench/results"), help="where the JSON and PNG go")
  p.add_argument("--reps", type=int, default=None, help="timed calls per measurement (quick: 5, full: 9)")
  p.add_argument(
    "--steps",
    type=int,
    default=None,
    help="steps per timed lax.fori_loop, 0 for none (GPU/TPU: 16; CPU: 4, on real rows, and --quick: (a), (d), (g))",
  )
  p.add_argument(
    "--strategy",
    choices=("auto", "cpu", "accelerator"),
    default=None,
    help="passed as strategy=NAME to every recipe; without it, nothing is passed",
  )
  p.add_argument("--quarters", action="store_true", help="also time each quarter of (e) alone at B=256 (GPU/TPU: on)")
  args = p.parse_args(argv)
  accelerator = accelerated()
  reps = args.reps or (5 if args.quick else 9)
  steps = args.steps if args.steps is not None else (16 if accelerator else 4)
  args.out.mkdir(parents=True, exist_ok=True)

  header = (
    f"{'V':>7} {'B':>4} {'dtype':>8} {'rows':>6}  {'workload':<22} {'ms':>9} {'x floor':>8} "
    f"{'loop ms':>9} {'x floor':>8} {'temp/logits':>11}"
  )
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; read floor = jnp.max(logits, axis=-1)")
  print(f"loop: ms per step of {steps} steps in one jitted lax.fori_loop, over the read floor timed the same way")
  if args.strategy:
    print(f"strategy={args.strategy!r} passed to every recipe")
  print(header)

  def log(r):
    loop = "" if r["loop_ms"] is None else f"{r['loop_ms']:>9.2f} {r['loop_ratio']:>8.1f}"
    print(
      f"{r['vocab']:>7} {r['batch']:>4} {r['dtype']:>8} {r['rows']:>6}  {r['workload']:<22} "
      f"{r['ms']:>9.2f} {r['ratio']:>8.1f} {loop:>18} {r['temp_vs_logits']:>11.2f}",
      flush=True,
    )

  results = []
  started = time.perf_counter()
  for vocab, batch, dtype, kind, with_baselines, quarters in grid(args.quick, accelerator):
    # On a CPU a step costs up to a second: loops only on real rows there, and few when quick.
    looping = steps if (accelerator or kind == "real") else 0
    looped_only = None if (accelerator or not args.quick) else {"a", "d", "g"}
    results += run_config(
      vocab,
      batch,
      dtype,
      kind,
      reps=reps,
      with_baselines=with_baselines,
      # A sort costs seconds per call on a CPU: the full grid sorts up to B=64 there.
      with_sort=not args.quick and (accelerator or batch <= 64),
      log=log,
      steps=looping,
      looped_only=looped_only,
      strategy=args.strategy,
      quarters=quarters or (args.quarters and batch == 256),
    )

  where = "GPU/TPU figures; V=262144, B=256 (and B=1)" if accelerator else "CPU figures; V=262144, B=64"
  print(f"\ntargets ({where}, float32):")
  checks = targets(results, accelerator)
  for what, value, met in checks:
    print(f"  {'met ' if met else 'MISS'}  {what:<52} {value}")
  stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
  meta = dict(
    date=stamp,
    machine=f"{platform.machine()} {_cpu_name()} {jax.devices()[0].device_kind}",
    device=jax.devices()[0].device_kind,
    cpus=jax.local_device_count() if jax.default_backend() != "cpu" else __import__("os").cpu_count(),
    jax=jax.__version__,
    backend=jax.default_backend(),
    torch=None if not torch_peers.available() else f"{torch_peers.torch.__version__} on {torch_peers.device()}",
    quick=args.quick,
    steps=steps,
    strategy=args.strategy,
    seconds=time.perf_counter() - started,
  )
  name = f"{'quick' if args.quick else 'full'}-{device_slug()}"
  (args.out / f"{name}.json").write_text(json.dumps(dict(meta=meta, results=results, targets=checks), indent=1))
  drew = plot(results, args.out / f"{name}.png", batch=256 if accelerator else 64)
  print(
    f"\nwrote {args.out / (name + '.json')}"
    + (f" and {args.out / (name + '.png')}" if drew else " (no plot: python3 -m pip install matplotlib)")
    + f" in {meta['seconds']:.0f} s"
  )
