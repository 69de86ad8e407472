"""DRY and penalties at W = 1024 against the default chain, on this machine (B = 64, V = 262144).

PYTHONPATH=. python3 bench/dry_speed.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import jsample
from jsample._timing import seconds

B, V, W = 64, 262144, 1024


def main() -> None:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(0, 3, (B, V)).astype(np.float32))
  # Text-like windows: a few hundred distinct tokens, with loops (repeats of 40-200 tokens).
  prompts = []
  for _ in range(B):
    base = list(rng.integers(0, 300, W))
    period = int(rng.integers(40, 200))
    prompts.append((base[: W - 3 * period] + base[:period] * 3)[-W:])
  breakers = np.full((8, 4), -1)
  breakers[:4, 0] = [
    1,
    2,
    3,
    4,
  ]  # four single-token breakers, as llama.cpp's default strings give for small vocabularies
  gemma = dict(top_k=64, top_p=0.95, min_p=0.05, temperature=1.0)

  def with_dry(strategy: str):
    return jsample.chain(
      jsample.penalties(),
      jsample.dry(),
      jsample.top_k(),
      jsample.top_p(),
      jsample.min_p(),
      jsample.temperature(),
      window_size=W,
      strategy=strategy,
    )

  floor = seconds(jax.jit(lambda x: jnp.max(x, axis=-1)), x)
  plain = jsample.gemma()
  t_plain = seconds(jax.jit(plain.pick), x, plain.init(seed=np.arange(B), prompt=np.asarray(prompts)[:, -64:]))
  wide = jsample.gemma(window_size=W)
  t_wide = seconds(jax.jit(wide.pick), x, wide.init(seed=np.arange(B), prompt=prompts))
  print(
    f"read floor {floor * 1e3:.1f} ms; gemma() {t_plain * 1e3:.1f} ms; gemma(window_size={W}) {t_wide * 1e3:.1f} ms"
  )
  for strategy in ("cpu",):  # the accelerator form compares all [W, W] pairs: for a GPU, not this CPU
    sampler = with_dry(strategy)
    common = dict(seed=np.arange(B), prompt=prompts, **gemma)
    cases = {
      "penalties": dict(repeat_penalty=1.1, penalty_last_n=-1),
      "DRY": dict(dry_multiplier=0.8, dry_sequence_breakers=breakers),
      "penalties + DRY": dict(
        repeat_penalty=1.1, penalty_last_n=-1, dry_multiplier=0.8, dry_sequence_breakers=breakers
      ),
    }
    for name, values in cases.items():
      t = seconds(jax.jit(sampler.pick), x, sampler.init(**common, **values))
      print(f"{strategy:12s} {name:16s} {t * 1e3:6.1f} ms = {t / t_plain:.2f} x gemma()")


if __name__ == "__main__":
  main()
