"""Penalties with OpenAI's and vLLM's scope: repetition over prompt and output, frequency
and presence over generated tokens only, against vLLM's ``apply_penalties`` arithmetic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
import jsample.testing

F32 = np.float32


def vllm_penalties(x, prompt, output, repeat, frequency, presence) -> np.ndarray:
  """vLLM's ``apply_penalties`` on one row, in float32 as vLLM computes it:
  ``x / r`` or ``x * r`` for tokens in prompt or output, then ``- f * count``,
  then ``- p * (count > 0)``, counts over the output only."""
  x = np.asarray(x, F32)
  vocab = x.size
  seen = np.zeros(vocab, bool)
  seen[[t for t in list(prompt) + list(output) if 0 <= t < vocab]] = True
  counts = np.bincount([t for t in output if 0 <= t < vocab], minlength=vocab).astype(F32)
  r = np.where(seen, F32(repeat), F32(1))
  with np.errstate(over="ignore", invalid="ignore"):
    y = np.where(x > 0, x / r, x * r)
    y = y - F32(frequency) * counts
    y = y - F32(presence) * (counts > 0).astype(F32)
    y = np.where(np.isnan(y), -np.inf, np.minimum(y, np.finfo(F32).max))
  return np.where(x > -np.inf, y, -np.inf).astype(np.float64)


def visible(prompt, output, window: int, last_n: int):
  """What a window of ``W`` with ``penalty_last_n`` sees: ``(prompt part, output part)``."""
  tokens = [t for t in prompt if t >= 0] + list(output)
  n = window if last_n < 0 else min(last_n, window)
  seen = tokens[len(tokens) - min(n, len(tokens)) :]
  made = seen[len(seen) - min(len(output), len(seen)) :]
  return seen[: len(seen) - len(made)], made


def scoped(x, s, prompt, output, window):
  if s["penalty_last_n"] == 0:
    return np.asarray(x, np.float64)
  seen, made = visible(prompt, output, window, s["penalty_last_n"])
  return vllm_penalties(x, seen, made, s["repeat_penalty"], s["frequency_penalty"], s["presence_penalty"])


SETTINGS = [
  dict(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6, penalty_last_n=-1),
  dict(repeat_penalty=0.7, frequency_penalty=-0.3, presence_penalty=-0.2, penalty_last_n=5),
  dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, penalty_last_n=0),
  dict(repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=1.5, penalty_last_n=3),
]


def test_openai_scope_conforms():
  """At the first draw nothing was generated: only the repeat penalty acts, over the prompt."""

  def ref(x, s, window):
    return scoped(x, s, window, [], len(window) + 1)

  jsample.testing.assert_stage_conforms(jsample.penalties(scope="openai"), ref, SETTINGS)


@pytest.mark.parametrize("window", [16, 160])
def test_generated_tokens_get_frequency_and_presence_on_both_paths(window):
  """Prompts and outputs of several lengths, the window shorter (16) and longer (160) than both; past 128
  the candidates look the window's tokens up instead of comparing every pair."""
  rng = np.random.default_rng(window)
  rows, vocab, steps = 8, 500, 12
  x = rng.normal(0, 2, (rows, vocab)).astype(np.float32)
  x[:, :20] = np.round(x[:, :20])  # ties among likely window tokens
  best = np.argsort(-x, axis=1)[:, :12]
  prompts = [list(rng.choice(best[i], int(rng.integers(0, 20)))) for i in range(rows)]
  outputs = np.stack([rng.choice(best[i], steps) for i in range(rows)]).T  # [steps, rows]
  per_row = {k: np.array([SETTINGS[i % 4][k] for i in range(rows)]) for k in SETTINGS[0]}
  padded = np.full((rows, 20), -1)
  for i, p in enumerate(prompts):
    padded[i, : len(p)] = p

  def state_of(sampler):
    state = sampler.init(seed=np.arange(rows), prompt=padded, **per_row)
    for tokens in outputs:
      state = sampler.accept(jnp.asarray(tokens, jnp.int32), state)
    return state

  want = np.stack(
    [
      jsample.testing.reference_probs(
        lambda r, s, w, i=i: scoped(r, s, prompts[i], outputs[:, i].tolist(), window),
        x[i],
        {k: v[i] for k, v in per_row.items()},
        [],
      )
      for i in range(rows)
    ]
  )
  tokens = None
  stages = (jsample.penalties(scope="openai"), jsample.temperature(1.0))
  for strategy in jsample.testing.STRATEGIES:
    for budget in (4, 16, vocab):
      sampler = jsample.chain(*stages, window_size=window, budget=budget, strategy=strategy)
      state = state_of(sampler)
      # One program for both: each compile is most of the test's time.
      run = jax.jit(lambda x, s, sampler=sampler: (sampler.probs(x, s), sampler.pick(x, s)[0]))
      probs, picked = run(jnp.asarray(x), state)
      np.testing.assert_allclose(np.asarray(probs), want, atol=2e-6)
      tokens = np.asarray(picked) if tokens is None else tokens
      np.testing.assert_array_equal(picked, tokens)
    # The full path alone does not depend on the candidate budget: once per strategy.
    full = jax.jit(lambda x, s, sampler=sampler: jsample.testing.full_path_probs(sampler, x, s))
    np.testing.assert_allclose(np.asarray(full(jnp.asarray(x), state)), want, atol=2e-6)


def test_scopes_differ_only_in_what_counts_as_generated():
  """llama.cpp's scope penalises the prompt's tokens too; OpenAI's only after they are generated,
  and again only for output after a new prompt."""
  x = jnp.array([0.0, 1.0, 2.0, 1.9])
  for scope, first in (("llama.cpp", 3), ("openai", 2)):
    sampler = jsample.chain(jsample.penalties(presence=0.5, scope=scope), jsample.temperature(0.0))
    state = sampler.init(seed=0, prompt=[2])
    token, state = sampler.pick(x, state)
    assert int(token) == first, scope
  sampler = jsample.chain(jsample.penalties(presence=0.5, scope="openai"), jsample.temperature(0.0))
  state = sampler.accept(2, sampler.init(seed=0, prompt=[1]))
  assert int(sampler.pick(x, state)[0]) == 3  # 2 was generated
  state = sampler.load_prompt([3], state)
  y = jnp.array([0.0, 1.0, 2.0, 2.2])
  assert int(sampler.pick(y, state)[0]) == 3  # a new prompt: nothing generated since, nothing penalised


def test_a_bad_scope_is_refused():
  with pytest.raises(ValueError, match="scope"):
    jsample.penalties(scope="vllm")
