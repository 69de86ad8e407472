"""Each recipe's stage order against its engine's documented order."""

import jax
import jax.numpy as jnp

import jsample


def names(sampler) -> list[str]:
  return [stage.name for stage in sampler.stages]


def test_llama_cpp_is_llama_servers_default_chain():
  # common_sampler_init: logit_bias, then `samplers` (default penalties; dry; top_n_sigma; top_k; typ_p; top_p;
  # min_p; xtc; temperature); mirostat 1/2 replaces the chain with logit_bias + temperature + mirostat.
  want = ["logit_bias", "penalties", "dry", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temperature"]
  assert names(jsample.llama_cpp()) == want + ["mirostat"]
  assert names(jsample.gemma()) == ["penalties", "top_k", "top_p", "min_p", "temperature"]  # the stages it uses


def test_vllm_is_the_v1_samplers_order():
  # vllm/v1/sample/sampler.py: allowed ids, bad words, min_tokens, logit bias, penalties; then in `sample`:
  # temperature, min_p (argmax-invariant processors), top_k/top_p.
  want = ["allowed_tokens", "banned_tokens", "min_tokens", "logit_bias", "penalties", "temperature", "min_p"]
  assert names(jsample.vllm()) == want + ["top_k", "top_p"]


def test_hf_is_transformers_logits_processor_order():
  # GenerationMixin._get_logits_processor: repetition penalty, suppress_tokens, min_new_tokens, then the
  # warpers temperature, top_k, top_p, min_p, typical, epsilon, eta.
  want = ["penalties", "banned_tokens", "min_tokens", "temperature", "top_k", "top_p", "min_p", "typical"]
  assert names(jsample.hf()) == want + ["epsilon", "eta"]


def test_defaults_are_the_engines():
  s = jsample.gemma().init(seed=0).settings
  assert (int(s["top_k"]), float(s["temperature"]), round(float(s["min_p"]), 6)) == (64, 1.0, 0.05)
  s = jsample.vllm().init(seed=0).settings
  assert (int(s["top_k"]), float(s["top_p"]), float(s["min_p"])) == (0, 1.0, 0.0)
  assert int(jsample.hf().init(seed=0).settings["top_k"]) == 50


def test_mirostat_rows_get_llama_cpps_mirostat_chain():
  # On a mirostat row every stage between logit bias and temperature is neutral: the chain keeps what
  # temperature + mirostat alone keep.
  logits = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.06, 0.04]))
  full = jsample.llama_cpp()
  alone = jsample.chain(jsample.temperature(0.8), jsample.mirostat(2, tau=1.5, eta=0.1))
  row = jsample.mirostat_neutral(dict(mirostat=2, mirostat_tau=1.5, top_k=2))
  got = full.probs(logits, full.init(seed=0, **row))
  want = alone.probs(logits, alone.init(seed=0, mirostat_tau=1.5))
  assert jnp.allclose(got, want, atol=1e-6)


def test_stage_sizes_are_recipe_keywords():
  sampler = jsample.vllm(logit_bias_size=3, allowed_tokens_size=2, logit_bias_ids=[5], logit_bias_values=[2.0])
  state = sampler.init(seed=0)
  assert state.settings["logit_bias_ids"].tolist() == [5, -1, -1]
  token, _ = jax.jit(sampler.pick)(jnp.zeros(8), state._replace())
  assert token.shape == ()
