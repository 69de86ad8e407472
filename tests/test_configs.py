"""Config readers on real files and requests, and on malformed ones."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from jsample._src.recipes import LLAMA_CPP_ORDER

V = 300


def run(config, steps=3):
  state = config.sampler.init(seed=config.extras.get("seed", 0), prompt=[3, 4, 5], **config.settings)
  pick = jax.jit(config.sampler.pick)
  logits = jnp.asarray(np.random.default_rng(0).normal(size=V).astype(np.float32))
  tokens = []
  for _ in range(steps):
    token, state = pick(logits, state)
    tokens.append(int(token))
  return tokens


GEMMA3 = {
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "do_sample": True,
  "eos_token_id": [1, 106],
  "pad_token_id": 0,
  "top_k": 64,
  "top_p": 0.95,
  "transformers_version": "4.50.0.dev0",
}


def test_generation_config_file(tmp_path):
  path = tmp_path / "generation_config.json"
  path.write_text(json.dumps(GEMMA3))
  config = jsample.from_generation_config(path)
  assert [s.name for s in config.sampler.stages][3] == "temperature"
  s = config.sampler.init(seed=0, **config.settings).settings
  assert (int(s["top_k"]), float(s["top_p"]), float(s["temperature"])) == (64, np.float32(0.95), 1.0)
  assert config.extras["eos_token_id"] == [1, 106] and config.extras["bos_token_id"] == 2
  assert len(run(config)) == 3


def test_generation_config_greedy_and_warpers():
  config = jsample.from_generation_config(
    dict(
      do_sample=False,
      temperature=0.7,
      epsilon_cutoff=3e-4,
      eta_cutoff=1e-3,
      suppress_tokens=[7],
      min_new_tokens=2,
      eos_token_id=1,
    )
  )
  assert float(config.settings["temperature"]) == 0.0 and config.settings["banned_token_ids"][0] == 7
  assert config.settings["min_tokens"] == 2 and len(run(config)) == 3


@pytest.mark.parametrize(
  "bad, field",
  [
    (dict(top_k=-1), "top_k"),
    (dict(top_p="0.9"), "top_p"),
    (dict(temperature=0.0), "temperature"),
    (dict(num_beams=4), "num_beams"),
    (dict(eta_cutoff=1.0), "eta_cutoff"),
    (dict(do_sample="yes"), "do_sample"),
    (dict(sampling="on"), "sampling"),
    (dict(min_new_tokens=3), "min_new_tokens"),
    (dict(suppress_tokens=[-2]), "suppress_tokens"),
  ],
)
def test_generation_config_rejects(bad, field):
  with pytest.raises(ValueError, match=field):
    jsample.from_generation_config(bad)


def test_openai_request():
  request = dict(
    model="m",
    prompt="hi",
    temperature=0.7,
    top_p=0.9,
    top_k=-1,
    min_p=0.05,
    frequency_penalty=0.5,
    presence_penalty=0.2,
    repetition_penalty=1.1,
    seed=7,
    logit_bias={"5": -100, "6": 3},
    logprobs=3,
    n=2,
    min_tokens=2,
    stop_token_ids=[9],
    max_tokens=16,
    allowed_token_ids=list(range(40)),
  )
  config = jsample.from_openai(request, eos_token_ids=[1])
  assert config.extras == dict(model="m", prompt="hi", seed=7, logprobs=3, n=2, stop_token_ids=[9], max_tokens=16)
  assert int(config.settings["top_k"]) == 0 and config.settings["logit_bias_ids"][:2].tolist() == [5, 6]
  assert config.settings["eos_token_ids"][:2].tolist() == [1, 9]
  tokens = run(config)
  assert all(t < 40 and t != 5 for t in tokens)


@pytest.mark.parametrize(
  "bad, field",
  [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(logit_bias={"a": 1}), "logit_bias"),
    (dict(logit_bias={"3": 500}), "logit_bias"),
    (dict(bad_words=["foo"]), "bad_words"),
    (dict(best_of=2), "best_of"),
    (dict(n=True), "n"),
    (dict(top_logprobs=21), "top_logprobs"),
    (dict(min_tokens=2), "min_tokens"),
  ],
)
def test_openai_rejects(bad, field):
  with pytest.raises(ValueError, match=field):
    jsample.from_openai(bad)


def test_gguf_file(tmp_path):
  gguf = pytest.importorskip("gguf")
  path = tmp_path / "model.gguf"
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_uint32("general.sampling.top_k", 20)
  writer.add_float32("general.sampling.top_p", 0.8)
  writer.add_float32("general.sampling.temp", 0.6)
  writer.add_int32("general.sampling.penalty_last_n", 32)
  writer.add_float32("general.sampling.penalty_repeat", 1.05)
  writer.add_string("general.sampling.sequence", "penalties;top_k;top_p;temp")
  writer.add_tensor("w", np.zeros(4, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  config = jsample.from_gguf(path)
  names = [s.name for s in config.sampler.stages]
  assert names == ["logit_bias", "penalties", "top_k", "top_p", "temperature", "mirostat"]
  assert config.settings["top_k"] == 20 and config.settings["penalty_last_n"] == 32
  assert abs(config.settings["temperature"] - 0.6) < 1e-6
  assert len(run(config)) == 3


def test_gguf_mirostat_rows_are_llama_cpps_mirostat_chain():
  config = jsample.from_gguf(
    {"general.sampling.mirostat": 2, "general.sampling.mirostat_tau": 3.0, "general.name": "x"}
  )
  assert config.settings["top_k"] == 0 and config.settings["min_p"] == 0.0
  assert len(run(config)) == 3


@pytest.mark.parametrize(
  "bad, field",
  [
    ({"general.sampling.top_p": 1.5}, "general.sampling.top_p"),
    ({"general.sampling.mirostat": 3}, "general.sampling.mirostat"),
    ({"general.sampling.sequence": "top_k;banana"}, "general.sampling.sequence"),
    ({"general.sampling.sequence": "top_k;penalties"}, "general.sampling.sequence"),
    ({"general.sampling.sequence": "top_k", "general.sampling.top_p": 0.9}, "top_p"),
    ({"general.sampling.top_a": 0.1}, "general.sampling.top_a"),
    ({"general.sampling.top_k": "40"}, "general.sampling.top_k"),
  ],
)
def test_gguf_rejects(bad, field):
  with pytest.raises(ValueError, match=field):
    jsample.from_gguf(bad)


# --- llama-server /completion ---------------------------------------------------------

LLAMA_SERVER_DEFAULTS = dict(
  prompt="Once upon a time",
  n_predict=16,
  stream=False,
  cache_prompt=True,
  temperature=0.8,
  dynatemp_range=0.0,
  dynatemp_exponent=1.0,
  top_k=40,
  top_p=0.95,
  min_p=0.05,
  typical_p=1.0,
  xtc_probability=0.0,
  xtc_threshold=0.1,
  min_keep=0,
  top_n_sigma=-1.0,
  repeat_penalty=1.1,
  repeat_last_n=64,
  presence_penalty=0.0,
  frequency_penalty=0.0,
  dry_multiplier=0.8,
  dry_base=1.75,
  dry_allowed_length=2,
  dry_penalty_last_n=-1,
  dry_sequence_breakers=[[10], [11, 12]],
  mirostat=0,
  mirostat_tau=5.0,
  mirostat_eta=0.1,
  seed=-1,
  n_probs=3,
  logit_bias=[[5, -2.0], [5, False]],
  samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
  ignore_eos=False,
  stop=["\n\n"],
)


def test_llama_server_request():
  config = jsample.from_llama_server(LLAMA_SERVER_DEFAULTS)
  assert [s.name for s in config.sampler.stages] == list(LLAMA_CPP_ORDER)
  assert config.extras["seed"] is None and config.extras["n_probs"] == 3 and config.extras["stop"] == ["\n\n"]
  assert set(config.extras) == {
    "prompt",
    "n_predict",
    "stream",
    "cache_prompt",
    "seed",
    "n_probs",
    "ignore_eos",
    "stop",
  }
  s = config.settings
  assert s["logit_bias_ids"][:2].tolist() == [5, 5] and s["logit_bias_values"][1] == -np.inf
  assert s["dry_sequence_breakers"][:2].tolist() == [[10, -1, -1, -1], [11, 12, -1, -1]]
  assert s["penalty_last_n"] == 64 and s["repeat_penalty"] == 1.1
  tokens = run(config)
  assert len(tokens) == 3 and 5 not in tokens
  _, state = config.sampler.pick_with_info(jnp.zeros(V), config.sampler.init(seed=0, **config.settings), top_logprobs=3)


class ToyTokenizer:
  """Only ``encode``: one id per character (ids 20 +), so ``"\\n"`` is 30."""

  def encode(self, text):
    return [20 + ord(c) % 200 for c in text]


def test_llama_server_string_breakers_encode_only():
  request = dict(dry_multiplier=0.8, dry_sequence_breakers=["\n", "ab"], logit_bias={"7": 1.5, "a": False})
  config = jsample.from_llama_server(request, tokenizer=ToyTokenizer())
  rows = config.settings["dry_sequence_breakers"]
  assert rows[:2].tolist() == [[30, -1, -1, -1], [117, 118, -1, -1]]
  assert config.settings["logit_bias_ids"][:2].tolist() == [7, 117]
  assert config.settings["logit_bias_values"][1] == -np.inf
  assert 117 not in run(config)


def test_llama_server_string_breakers_with_vocabulary():
  from jsample.models.tokenizer import CONTROL, NORMAL, USER_DEFINED, Tokenizer

  texts = [
    "<eos>",
    "<bos>",
    "\n",
    "a",
    "b",
    "▁",
    ":",
    "):",
    "▁an",
    "d",
    "▁and",
    "▁then",
    "▁the",
    "n",
    "\n\n",
    "t",
    "h",
    "e",
  ]
  types = [CONTROL, CONTROL, USER_DEFINED, *[NORMAL] * 11, USER_DEFINED, *[NORMAL] * 3]
  scores = [0.0, 0.0, 0.0, -1, -1, -1, -1, -2, -2, -1, -1.5, -1.5, -1.8, -1, 0.0, -1, -1, -1]
  tok = Tokenizer(texts, scores, types, bos=1, eos=0)
  # The default breakers: every token containing "\n" or ":" is a single-token breaker.
  config = jsample.from_llama_server(dict(dry_multiplier=0.8), tokenizer=tok)
  assert config.settings["dry_sequence_breakers"][:4, 0].tolist() == [2, 14, 6, 7]
  assert (config.settings["dry_sequence_breakers"][:4, 1:] == -1).all()
  # " and then": heads are tokens ending with a prefix of it, followed by the rest's tokens.
  got = jsample.dry_breaker_sequences([" and then"], tok)
  assert [10, *tok.encode(" then", bos=False)] in got  # " and" + " then"
  assert [5, *tok.encode("and then", bos=False)] in got  # " " + "and then"
  assert [8, *tok.encode("d then", bos=False)] in got  # " an" + "d then"
  assert all(g[0] not in (2, 14) for g in got)
  config = jsample.from_llama_server(dict(dry_multiplier=0.8, dry_sequence_breakers=[" and then"]), tokenizer=tok)
  assert len(run(config)) == 3


def test_llama_server_ignore_eos_bans_every_end_of_generation_id():
  """As llama-server: ignore_eos puts a -inf bias on EOS and the end-of-turn tokens, after the request's biases."""
  from jsample.models.tokenizer import CONTROL, NORMAL, Tokenizer

  texts = ["<eos>", "<bos>", "<end_of_turn>", *[f"t{i}" for i in range(V - 3)]]
  tok = Tokenizer(texts, [0.0] * V, [CONTROL, CONTROL, CONTROL, *[NORMAL] * (V - 3)], bos=1, eos=0)
  assert jsample.end_of_generation_ids(tok) == [0, 2]
  config = jsample.from_llama_server(dict(ignore_eos=True, logit_bias=[[7, 1.5]], temperature=0.0), tokenizer=tok)
  s = config.settings
  assert s["logit_bias_ids"][:3].tolist() == [7, 0, 2]
  assert s["logit_bias_values"][:3].tolist() == [1.5, -np.inf, -np.inf]
  logits = np.zeros(V, np.float32)
  logits[[0, 2]] = 50.0  # EOS and end-of-turn are the model's favourites, and banned
  state = config.sampler.init(seed=0, **s)
  assert int(config.sampler.pick(jnp.asarray(logits), state)[0]) == 7
  with pytest.raises(ValueError, match="ignore_eos"):
    jsample.from_llama_server(dict(ignore_eos=True))
  assert (jsample.from_llama_server(dict(ignore_eos=False)).settings["logit_bias_ids"] == -1).all()


def test_llama_server_samplers_order_and_mirostat():
  request = dict(samplers="kpt", top_k=20, top_p=0.9, min_p=0.05, temperature=0.7, repeat_last_n=64)
  config = jsample.from_llama_server(request)
  assert [s.name for s in config.sampler.stages] == ["logit_bias", "top_k", "top_p", "temperature", "mirostat"]
  assert "min_p" not in config.settings  # llama-server's default for a left-out sampler: accepted, unused
  assert len(run(config)) == 3
  config = jsample.from_llama_server(dict(samplers=["min_p", "temperature"], min_p=0.1, top_k=0))
  assert [s.name for s in config.sampler.stages] == ["logit_bias", "min_p", "temperature", "mirostat"]
  assert len(run(config)) == 3
  config = jsample.from_llama_server(dict(mirostat=2, mirostat_tau=3.0, samplers=["top_k"], top_k=5, seed=3))
  assert [s.name for s in config.sampler.stages] == list(LLAMA_CPP_ORDER)
  assert config.settings["top_k"] == 0 and config.extras["seed"] == 3
  assert len(run(config)) == 3


def test_llama_server_accepts_a_left_out_samplers_field_at_its_default_or_neutral_value():
  # llama.cpp never reads them. repeat_last_n 64 and min_keep 0 are llama-server's defaults; top_p 1,
  # xtc_threshold 1 and dry_penalty_last_n 0 are neutral.
  accepted = dict(repeat_last_n=64, min_keep=0, top_p=1.0, xtc_threshold=1.0, dry_penalty_last_n=0)
  for field, value in accepted.items():
    config = jsample.from_llama_server({"samplers": ["temperature"], field: value})
    assert [s.name for s in config.sampler.stages] == ["logit_bias", "temperature", "mirostat"], field
    assert set(config.settings) == {"logit_bias_ids", "logit_bias_values"}, field


@pytest.mark.parametrize(
  "bad, field",
  [
    (dict(tfs_z=1.0), "tfs_z"),
    (dict(top_k="40"), "top_k"),
    (dict(top_p=0), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(mirostat=3), "mirostat"),
    (dict(seed=2**32), "seed"),
    (dict(n_probs=-1), "n_probs"),
    (dict(logit_bias=[[5, True]]), "logit_bias"),
    (dict(logit_bias=[[5]]), "logit_bias"),
    (dict(logit_bias={"hello": -1}), "logit_bias"),
    (dict(dry_multiplier=0.8, dry_sequence_breakers=["\n"]), "dry_sequence_breakers"),
    (dict(dry_multiplier=0.8), "dry_sequence_breakers"),
    (dict(dry_sequence_breakers=[]), "dry_sequence_breakers"),
    (dict(dry_sequence_breakers=[[1], "x"]), "dry_sequence_breakers"),
    (dict(samplers=["top-k"]), "samplers"),
    (dict(samplers="kq"), "samplers"),
    (dict(samplers=["top_k", "penalties"]), "samplers"),
    (dict(samplers=["top_k"], top_p=0.5), "top_p"),
    (dict(grammar="root ::= x"), "grammar"),
  ],
)
def test_llama_server_rejects(bad, field):
  with pytest.raises(ValueError, match=field):
    jsample.from_llama_server(bad)
