"""``jsample``: ``jsample generate`` (Gemma 3 270M writes text) and ``jsample demo`` (this module's default).

``jsample demo``, also ``python -m jsample`` with no subcommand, shows what a sampling chain does to one row of
logits.

Builds a Zipf-shaped row, applies each stage's full-vocabulary function (``on_row``) in chain order and prints,
per stage, how many tokens survive, the entropy of the softmax over them, and the best survivor. Then it draws a
token with the jitted sampler and times the draw against the read floor (``jnp.max`` of the same row).

Examples:
  python -m jsample --top-k 5
  python -m jsample --recipe hf --temperature 0.7 --prompt-tokens 3,14,15 --repeat-penalty 1.3 --draws 1000
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jsample
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


def token_ids(text: str) -> list[int]:
  """Parses comma-separated token ids."""
  return [int(t) for t in text.split(",") if t.strip()]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="jsample [demo]", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--recipe", choices=sorted(RECIPES), default="gemma", help="the chain and its defaults (gemma)")
  p.add_argument("--vocab", type=int, default=262144, help="V, the row's width (262144, Gemma's vocabulary)")
  p.add_argument("--zipf", type=float, default=1.1, help="s, the Zipf exponent of the row (1.1)")
  p.add_argument("--seed", type=int, default=0, help="the sampler's seed, in [0, 2**32) (0)")
  recipe_default = " (default: the recipe's)"
  for flag, kind, text in [
    ("--temperature", float, "<= 0 is greedy"),
    ("--top-k", int, "<= 0 keeps all"),
    ("--top-p", float, "in (0, 1]; 1 keeps all"),
    ("--min-p", float, "in [0, 1]; 0 keeps all"),
    ("--repeat-penalty", float, "> 0; 1 is neutral"),
    ("--frequency-penalty", float, "0 is neutral"),
    ("--presence-penalty", float, "0 is neutral"),
    ("--penalty-last-n", int, "recent tokens the penalties see, up to the window of 64; -1: all"),
  ]:
    p.add_argument(flag, type=kind, help=text + recipe_default)
  p.add_argument("--prompt-tokens", type=token_ids, metavar="IDS", help="comma-separated ids loaded into the window")
  p.add_argument("--draws", type=int, default=0, metavar="N", help="also draw N tokens, seeds seed..seed+N-1 (0)")
  return p


def zipf_row(vocab: int, exponent: float) -> jax.Array:
  """The demo row ``[V]`` float32; see ``--help``."""
  rng = np.random.default_rng(ROW_SEED)
  rank = rng.permutation(vocab)
  return jnp.asarray(-exponent * np.log1p(rank) + NOISE * rng.standard_normal(vocab), jnp.float32)


def row_stats(logits: jax.Array):
  """Survivors, entropy (nats), top probability and top id of ``softmax(logits)`` ``[V]``."""
  alive = logits > -jnp.inf
  log_p = logits - jax.nn.logsumexp(logits)
  p = jnp.where(alive, jnp.exp(log_p), 0.0)
  entropy = -jnp.sum(jnp.where(alive, p * log_p, 0.0))
  return jnp.sum(alive, dtype=jnp.int32), entropy, jnp.max(p), jnp.argmax(logits)


def staged(stage: jsample.Stage, vocab: int):
  """``stage.on_row`` and the stats of its result, jitted; ``vocab`` stays static."""

  def apply(logits, settings, window, position):
    out = stage.on_row(logits, settings, jsample.Context(window, position, vocab))
    return out, row_stats(out)

  return jax.jit(apply)


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
  names = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"]
  settings = {n: getattr(args, n) for n in names + ["penalty_last_n"] if getattr(args, n) is not None}
  sampler = RECIPES[args.recipe](vocab_size=args.vocab)
  try:
    state = sampler.init(seed=args.seed, prompt=args.prompt_tokens, **settings)
  except ValueError as e:
    cli.error(str(e))
  logits = zipf_row(args.vocab, args.zipf)

  used = " ".join(f"{n}={v.item():g}" for n, v in state.settings.items())
  print(f"recipe {args.recipe}, V={args.vocab}, Zipf s={args.zipf:g}, seed {args.seed}, position {int(state.position)}")
  print(f"settings: {used}\n")
  print(f"{'stage':<12} {'survivors':>9} {'entropy':>8} {'p(top)':>8} {'top id':>8}")
  rows = [("raw", jax.jit(row_stats)(logits))]
  final = logits
  for stage in sampler.stages:
    final, stats = staged(stage, args.vocab)(final, state.settings, state.window, state.position)
    rows.append((stage.name, stats))
  for name, (survivors, entropy, top_p, top_id) in rows:
    print(f"{name:<12} {int(survivors):>9} {float(entropy):>8.4f} {float(top_p):>8.4f} {int(top_id):>8}")

  draw = jax.jit(sampler.pick_with_info)
  drawn, _ = draw(logits, state)
  token = int(drawn.token)
  chain_logprob = float(final[token] - jax.nn.logsumexp(final))
  logprob = f"logprob {float(drawn.logprob):.4f} (on_row chain: {chain_logprob:.4f})"
  print(f"\ndraw: token {token}, {logprob}, valid {bool(drawn.valid)}")
  t_draw, t_floor = seconds(draw, logits, state), seconds(jax.jit(jnp.max), logits)
  print(f"time: draw {t_draw * 1e6:.1f} us, read floor (jnp.max) {t_floor * 1e6:.1f} us, {t_draw / t_floor:.1f}x")

  if args.draws:
    tokens = many_draws(sampler, logits, state, np.arange(args.seed, args.seed + args.draws))
    expected = np.asarray(jax.nn.softmax(final))
    ids, counts = np.unique(tokens, return_counts=True)
    print(f"\n{args.draws} draws, seeds {args.seed}..{args.seed + args.draws - 1}: {len(ids)} distinct tokens")
    print(f"{'token':>8} {'count':>7} {'freq':>7} {'p':>7}")
    for i in np.argsort(-counts, kind="stable")[:10]:
      print(f"{ids[i]:>8} {counts[i]:>7} {counts[i] / args.draws:>7.4f} {expected[ids[i]]:>7.4f}")
  return 0


def cli(argv=None) -> int:
  """The ``jsample`` command: ``generate ...``, or ``[demo] ...`` for :func:`main`."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["generate"]:
    from jsample.models import generate

    generate.keep_compiled_programs()
    return generate.main(argv[1:])
  return main(argv[1:] if argv[:1] == ["demo"] else argv)


if __name__ == "__main__":
  raise SystemExit(cli())
