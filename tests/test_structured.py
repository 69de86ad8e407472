"""Structured output (``jsample.structured``, the ``structured`` extra): llguidance's bitmask as jsample's packed mask.

The small tests build a toy SentencePiece vocabulary and draw from random logits (a stand-in model); the mask is
checked against a brute-force one, token by token. The slow ones run ``jsample generate --json-schema`` and
``--regex`` on Gemma 3 270M and check that what it prints parses, validates and matches.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jsample
from jsample import structured
from jsample.models.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def needs_llguidance():
  """llguidance is in the test extra: a missing one skips here, and fails under CI (``$CI`` set)."""
  try:
    structured.llguidance()
  except structured.MissingExtra as error:
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
      pytest.fail(f"CI is set and {error}")
    pytest.skip(str(error))


# A toy vocabulary, GGUF-style: 0 <pad>, 1 <eos>, 2 <bos> are control tokens; then digits, "-", "▁", two merged
# tokens, and the 256 byte tokens. Every string has a tokenization, so any grammar over text can finish.
TOKENS = ["<pad>", "<eos>", "<bos>", *"0123456789", "-", "▁", "12", "345"] + [f"<0x{b:02X}>" for b in range(256)]
TYPES = [3, 3, 3] + [1] * 14 + [6] * 256
TOY = Tokenizer(TOKENS, np.zeros(len(TOKENS)), TYPES, bos=2, eos=1)
V = len(TOKENS)


SAMPLER = jsample.llama_cpp(vocab_size=V)
PICK = jax.jit(SAMPLER.pick)  # compiled once per batch size: the tests draw 8 rows


def sample(constraint: structured.Constraint, steps: int, seed: int = 0, check=None) -> np.ndarray:
  """Draws up to ``steps`` tokens per row from random logits (a stand-in model), masked by ``constraint``, until
  every row is done; returns them ``[steps, B]``. ``check(constraint, mask)`` sees every mask before its draw."""
  batch = len(constraint.done)
  state = SAMPLER.init(seed=np.arange(batch) + seed, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
  rng = np.random.default_rng(seed)
  drawn = []
  for _ in range(steps):
    if constraint.done.all():
      break
    mask = constraint.mask()
    if check is not None:
      check(constraint, mask)
    tokens, state = PICK(rng.normal(size=(batch, V)).astype(np.float32), state, mask=mask)
    constraint.advance(tokens)
    drawn.append(np.asarray(tokens))
  return np.stack(drawn)


def text(ids: list[int]) -> str:
  return TOY.decode(ids)


def brute_force(prefix: str, complete: str):
  """A ``check`` for :func:`sample`: each row's mask allows exactly the text tokens that keep its text a prefix of
  the language (``prefix`` matches the prefixes, ``complete`` the whole matches), and EOS where the text is
  complete; a done row's mask allows EOS alone. Where the grammar forces the next byte, llguidance allows only the
  token the vocabulary's own tokenizer spells it with (``-``, not the byte token ``<0x2D>``): a non-empty subset."""
  pieces, special = structured.pieces(TOY)

  def check(constraint: structured.Constraint, mask: np.ndarray) -> None:
    for row in range(len(constraint.done)):
      allowed = np.asarray(jsample.unpack_mask(mask[row], V))
      expected = np.zeros(V, bool)
      so_far = TOY.decode(constraint.text[row]).encode("latin-1")
      if constraint.done[row]:
        expected[TOY.eos] = True
      else:
        for j, piece in enumerate(pieces):
          expected[j] = j not in special and re.fullmatch(prefix, (so_far + piece).decode("latin-1")) is not None
        expected[TOY.eos] = re.fullmatch(complete, so_far.decode("latin-1")) is not None
      forced = not expected[TOY.eos] and len({pieces[j][:1] for j in np.flatnonzero(expected)}) == 1
      if forced:
        assert allowed.any() and not (allowed & ~expected).any(), f"row {row}"
      else:
        np.testing.assert_array_equal(allowed, expected, err_msg=f"row {row}")

  return check


def test_every_row_matches_its_regex_and_each_mask_is_the_brute_force_one():
  pattern = r"[0-9]{3}-[0-9]{2,4}"  # ASCII digits: the brute force reads bytes as latin-1 (\d in llguidance is Unicode)
  constraint = structured.Constraint(structured.compile_regex(pattern, TOY), batch=8)
  drawn = sample(constraint, steps=14, check=brute_force(r"[0-9]{0,3}|[0-9]{3}-[0-9]{0,4}", pattern))
  assert constraint.done.all() and constraint.completed().all()
  for row in range(8):
    assert re.fullmatch(pattern, text(constraint.text[row]))
    first_eos = list(drawn[:, row]).index(1)
    assert (drawn[first_eos:, row] == 1).all()  # once done, the row draws EOS alone


def test_an_unbounded_integer_gets_at_most_15_digits_and_each_mask_is_the_brute_force_one():
  constraint = structured.Constraint(structured.compile_json_schema({"type": "integer"}, TOY), batch=8)
  sample(constraint, steps=20, seed=1, check=brute_force(r"-?(0|[1-9][0-9]{0,14})?", r"-?(0|[1-9][0-9]{0,14})"))
  assert constraint.done.all()
  values = [json.loads(text(row)) for row in constraint.text]
  assert all(isinstance(v, int) and abs(v) < 10**15 for v in values)
  assert max(len(str(abs(v))) for v in values) > 5  # random logits run to the bound, not stopped short


def test_the_mask_is_jsamples_packed_layout():
  constraint = structured.Constraint(structured.compile_regex(r"[0-9]", TOY))
  allowed = np.asarray(jsample.unpack_mask(constraint.mask()[0], V))
  expected = np.zeros(V, bool)
  expected[3:13] = True  # the ten digit tokens
  expected[[TOKENS.index(f"<0x{ord(d):02X}>") for d in "0123456789"]] = True  # and the digits' bytes
  np.testing.assert_array_equal(allowed, expected)


SCHEMA = {
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0},
    "height": {"type": "number"},
    "role": {"enum": ["a", "b-1", 7]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
  },
  "required": ["name", "age", "height", "role", "tags"],
}


def test_every_row_is_valid_under_its_json_schema_with_bounded_numbers():
  jsonschema = pytest.importorskip("jsonschema")
  constraint = structured.Constraint(structured.compile_json_schema(SCHEMA, TOY), batch=8)
  sample(constraint, steps=400, seed=3)
  assert constraint.done.all()
  for row in constraint.text:
    line = text(row)
    value = json.loads(line)
    jsonschema.validate(value, SCHEMA)
    assert "\n" not in line and "  " not in line  # at most one space between JSON's tokens
    (height,) = re.findall(r'"height" ?: ?([^ ,]+)', line)
    assert re.fullmatch(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,6})?", height), height  # no exponent
    assert len(value["tags"]) <= 3 and len(value["name"]) <= 6


def test_bounded_schema_keeps_the_schemas_own_bounds_and_values():
  schema = {
    "type": "object",
    "properties": {"n": {"type": "integer", "exclusiveMaximum": 5}, "k": {"const": {"type": "integer"}}},
    "additionalProperties": True,
  }
  bounded = structured.bounded_schema(schema)
  assert bounded["properties"]["n"] == {"type": "integer", "exclusiveMaximum": 5, "minimum": -(10**15 - 1)}
  assert bounded["properties"]["k"] == {"const": {"type": "integer"}}  # a value, not a schema
  assert bounded["additionalProperties"] is True and "minimum" not in schema["properties"]["n"]  # a copy


def test_a_token_outside_the_grammar_is_refused():
  constraint = structured.Constraint(structured.compile_regex(r"[0-9]+", TOY))
  with pytest.raises(ValueError, match="row 0: token 13 is not allowed"):
    constraint.advance(np.array([TOKENS.index("-")]))


@pytest.mark.parametrize(
  "compile, grammar, message",
  [
    (structured.compile_regex, "(", "regex: regex '(': unclosed group"),
    (structured.compile_json_schema, "{not json", "json schema: not JSON: "),
    (structured.compile_json_schema, {"not": {"type": "string"}}, 'json schema: Unimplemented keys: ["not"]'),
    (structured.compile_json_schema, {"type": "strin"}, "json schema: Invalid type: strin"),
    (structured.compile_json_schema, {"type": "string", "pattern": "(?=a)b"}, "json schema: regex '(?=a)b': look"),
    (structured.compile_lark, "start: x", "lark grammar: "),
  ],
)
def test_what_the_backend_cannot_compile_is_a_one_line_value_error(compile, grammar, message):
  with pytest.raises(ValueError) as error:
    compile(grammar, TOY)
  assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_a_vocabulary_without_the_byte_tokens_the_grammar_needs_says_so():
  letters = Tokenizer(["<eos>", "a", "b"], np.zeros(3), [3, 1, 1], bos=0, eos=0)
  with pytest.raises(ValueError, match="no byte token <0x78>"):
    structured.compile_regex("x", letters)
  constraint = structured.Constraint(structured.compile_regex("a+x?", letters))
  constraint.advance([1])
  assert constraint.completed().tolist() == [True]  # "x" is optional: nothing needs spelling


def test_missing_extra_names_the_install_command_the_readme_gives(monkeypatch, capsys):
  from jsample.models import generate

  install = 'pip install "jsample[structured]"'
  assert install in (ROOT / "README.md").read_text()
  monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
  with pytest.raises(structured.MissingExtra, match=re.escape(install)):
    structured.compile_regex("a", TOY)
  assert generate.main(["x", "--regex", "a"]) == 1  # said before the model loads
  assert install in capsys.readouterr().err


def test_the_core_never_imports_llguidance():
  code = "import sys, jsample; print(sorted(m for m in sys.modules if 'llguidance' in m or m == 'jsample.structured'))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
  assert out.strip() == "[]"


# -- jsample generate --json-schema / --regex on Gemma 3 270M -----------------------------------------------------

PERSON = json.loads((ROOT / "tests" / "data" / "person.json").read_text())


@pytest.mark.slow
def test_cli_json_schema_output_parses_and_validates(capsys):
  jsonschema = pytest.importorskip("jsonschema")
  argv = ["A person, as JSON:", "--json-schema", str(ROOT / "tests/data/person.json"), "--batch", "2"]
  assert jsample_generate(argv + ["--max-tokens", "160"]) == 0
  out, err = capsys.readouterr()
  rows = out.splitlines()
  assert len(rows) == 2, out
  for row in rows:
    jsonschema.validate(json.loads(row), PERSON)
  assert "tokens/s" in err and "grammar" in err


@pytest.mark.slow
def test_cli_regex_output_matches(capsys):
  pattern = r"\(\d{3}\) \d{3}-\d{4}"
  # Two rows, as in the tests below: one set of compiled programs serves the three.
  assert jsample_generate(["The phone number is", "--regex", pattern, "--max-tokens", "24", "--batch", "2"]) == 0
  rows = capsys.readouterr().out.splitlines()
  assert len(rows) == 2 and all(re.fullmatch(pattern, row) for row in rows), rows


@pytest.mark.slow
def test_cli_exit_status_counts_the_rows_max_tokens_cut_off(capsys):
  assert jsample_generate(["Digits:", "--regex", r"\d{40}", "--max-tokens", "3", "--batch", "2"]) == 2
  out, err = capsys.readouterr()
  assert all(re.fullmatch(r"\d+", row) for row in out.split()) and "2 of 2 rows ([0, 1])" in err
  with pytest.raises(SystemExit):
    jsample_generate(["x", "--regex", "("])
  assert "unclosed group" in capsys.readouterr().err


@pytest.mark.slow
def test_the_mask_computed_during_the_forward_pass_draws_the_same_tokens():
  from jsample.models import generate, text

  gen = generate._generator(text.gemma3_270m())  # the command's: the programs of the tests above
  grammar = structured.compile_json_schema(PERSON, gen.text.tokenizer)
  runs = []
  for overlap in (True, False):
    constraint = structured.Constraint(grammar, batch=2)
    runs.append(np.stack(list(gen.run(["A person, as JSON:"] * 2, 24, 0, constraint, overlap=overlap))))
  np.testing.assert_array_equal(*runs)


def jsample_generate(argv: list[str]) -> int:
  from jsample.models import generate

  return generate.main(argv)
