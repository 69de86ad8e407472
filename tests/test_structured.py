"""Structured output (``jsample.structured``, the ``structured`` extra): XGrammar's bitmask as jsample's packed mask.

The small tests build a toy SentencePiece vocabulary; the slow ones run ``jsample generate --json-schema`` and
``--regex`` on Gemma 3 270M and check that what it prints parses, validates and matches.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jsample
from jsample import structured


@pytest.fixture(scope="module", autouse=True)
def needs_xgrammar():
  """XGrammar is in the test extra: a missing one skips here, and fails under CI (``$CI`` set)."""
  try:
    structured.xgrammar()
  except structured.MissingExtra as error:
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
      pytest.fail(f"CI is set and {error}")
    pytest.skip(str(error))


# A toy vocabulary, GGUF-style: 0 <pad>, 1 <eos>, 2 <bos> are control tokens; then digits, "-", "▁", and the
# 256 byte tokens. Every string has a tokenization, so any grammar over text can finish.
TOKENS = ["<pad>", "<eos>", "<bos>", *"0123456789", "-", "▁", "12", "345"] + [f"<0x{b:02X}>" for b in range(256)]
TYPES = [3, 3, 3] + [1] * 14 + [6] * 256
TOY = SimpleNamespace(tokens=TOKENS, types=TYPES, eos=1)
TEXT = {i: t for i, t in enumerate(TOKENS) if TYPES[i] == 1}


def toy_text(ids: list[int]) -> str:
  return "".join(TEXT[i].replace("▁", " ") if i in TEXT else chr(int(TOKENS[i][3:5], 16)) for i in ids)


def sample(constraint: structured.Constraint, steps: int, seed: int = 0) -> np.ndarray:
  """Draws ``steps`` tokens per row from random logits, masked by ``constraint``; returns them ``[steps, B]``."""
  batch, vocab = len(constraint.done), len(TOKENS)
  sampler = jsample.llama_cpp(vocab_size=vocab)
  state = sampler.init(seed=np.arange(batch) + seed, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
  step = jax.jit(sampler.pick)
  rng = np.random.default_rng(seed)
  drawn = []
  for _ in range(steps):
    logits = jnp.asarray(rng.normal(size=(batch, vocab)), jnp.float32)
    tokens, state = step(logits, state, mask=constraint.mask())
    constraint.advance(tokens)
    drawn.append(np.asarray(tokens))
  return np.stack(drawn)


def test_every_row_matches_its_regex_and_ends_with_eos():
  pattern = r"\d{3}-\d{2,4}"
  constraint = structured.Constraint(structured.compile_regex(pattern, TOY), batch=6)
  drawn = sample(constraint, steps=12)
  assert constraint.done.all() and constraint.completed().all()
  for row in range(6):
    assert re.fullmatch(pattern, toy_text(constraint.text[row]))
    first_eos = list(drawn[:, row]).index(1)
    assert (drawn[first_eos:, row] == 1).all()  # once done, the row draws EOS alone


def test_the_mask_is_jsamples_packed_layout():
  constraint = structured.Constraint(structured.compile_regex(r"[0-9]", TOY))
  allowed = np.asarray(jsample.unpack_mask(constraint.mask()[0], len(TOKENS)))
  expected = np.zeros(len(TOKENS), bool)
  expected[3:13] = True  # the ten digit tokens
  expected[[TOKENS.index(f"<0x{ord(d):02X}>") for d in "0123456789"]] = True  # and the digits' bytes
  np.testing.assert_array_equal(allowed, expected)


def test_json_schema_output_validates():
  schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}}}
  schema["required"] = ["n"]
  constraint = structured.Constraint(structured.compile_json_schema(schema, TOY), batch=4)
  sample(constraint, steps=24, seed=3)
  for row in range(4):
    value = json.loads(toy_text(constraint.text[row]))
    assert set(value) == {"n"} and 0 <= value["n"] <= 999


def test_a_token_outside_the_grammar_is_refused():
  constraint = structured.Constraint(structured.compile_regex(r"[0-9]+", TOY))
  with pytest.raises(ValueError, match="row 0: token 13 is not allowed"):
    constraint.advance(np.array([TOKENS.index("-")]))


def test_bad_grammars_are_value_errors():
  with pytest.raises(ValueError, match="regex: .*parenthesis"):
    structured.compile_regex("(", TOY)
  with pytest.raises(ValueError, match="json schema: "):
    structured.compile_json_schema("{not json", TOY)


def test_missing_extra_names_the_install_command(monkeypatch, capsys):
  from jsample.models import generate

  monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
  with pytest.raises(structured.MissingExtra, match=re.escape('pip install "jsample[structured]"')):
    structured.tokenizer_info(TOY)
  assert generate.main(["x", "--regex", "a"]) == 1  # said before the model loads
  assert 'pip install "jsample[structured]"' in capsys.readouterr().err


def test_the_core_never_imports_xgrammar():
  code = "import sys, jsample; print(sorted(m for m in sys.modules if 'xgrammar' in m or m == 'jsample.structured'))"
  root = Path(__file__).resolve().parents[1]
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
  assert out.strip() == "[]"


# -- jsample generate --json-schema / --regex on Gemma 3 270M -----------------------------------------------------

PERSON = {
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24},
  },
  "required": ["name", "age", "city"],
}


@pytest.mark.slow
def test_cli_json_schema_output_parses_and_validates(tmp_path, capsys):
  jsonschema = pytest.importorskip("jsonschema")
  path = tmp_path / "person.json"
  path.write_text(json.dumps(PERSON))
  argv = ["A person, as JSON:", "--json-schema", str(path), "--batch", "2", "--max-tokens", "48"]
  assert jsample_generate(argv + ["--temperature", "1.0"]) == 0
  out, err = capsys.readouterr()
  rows = out.splitlines()
  assert len(rows) == 2, out
  for row in rows:
    jsonschema.validate(json.loads(row), PERSON)
  assert "tokens/s" in err


@pytest.mark.slow
def test_cli_regex_output_matches(capsys):
  pattern = r"\(\d{3}\) \d{3}-\d{4}"
  assert jsample_generate(["The phone number is", "--regex", pattern, "--max-tokens", "24"]) == 0
  out = capsys.readouterr().out
  assert re.fullmatch(pattern, out.rstrip("\n")), out


@pytest.mark.slow
def test_cli_says_when_max_tokens_ends_before_the_grammar(capsys):
  assert jsample_generate(["Digits:", "--regex", r"\d{40}", "--max-tokens", "3"]) == 1
  out, err = capsys.readouterr()
  assert re.fullmatch(r"\d+", out.strip()) and "ended before the grammar was complete" in err
  with pytest.raises(SystemExit):
    jsample_generate(["x", "--regex", "("])
  assert "parenthesis" in capsys.readouterr().err


def jsample_generate(argv: list[str]) -> int:
  from jsample.models import generate

  return generate.main(argv)
