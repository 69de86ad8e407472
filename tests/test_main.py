"""``python -m jsample``: the stage table and the draw, on a small row."""

import numpy as np
import pytest

import jsample
from jsample.__main__ import main, zipf_row

VOCAB = 4096


def table(out: str) -> dict[str, list[str]]:
  """The stage table, by stage name: ``[survivors, entropy, p(top), top id]``."""
  start = out.index("stage")
  lines = out[start:].split("\n\n")[0].splitlines()[1:]
  return {line.split()[0]: line.split()[1:] for line in lines}


def drawn_token(out: str) -> int:
  (line,) = [line for line in out.splitlines() if line.startswith("draw:")]
  return int(line.split("token ")[1].split(",")[0])


@pytest.mark.parametrize("recipe", ["gemma", "llama_cpp", "hf"])
def test_table_has_every_stage_in_order(recipe, capsys):
  assert main(["--vocab", str(VOCAB), "--recipe", recipe, "--top-k", "5"]) == 0
  rows = table(capsys.readouterr().out)
  names = ["input"] + [stage.name for stage in getattr(jsample, recipe)().stages]
  assert list(rows) == names
  assert int(rows["input"][0]) == VOCAB
  assert int(rows["top_k"][0]) == 5
  survivors = [int(r[0]) for r in rows.values()]
  assert all(1 <= s <= VOCAB for s in survivors)
  if recipe != "hf":  # truncations only remove tokens; hf's temperature comes first and keeps them all
    assert survivors == sorted(survivors, reverse=True)


def test_greedy_draws_the_argmax(capsys):
  main(["--vocab", str(VOCAB), "--temperature", "0", "--draws", "8"])
  out = capsys.readouterr().out
  best = int(np.argmax(np.asarray(zipf_row(VOCAB, 1.1))))
  assert drawn_token(out) == best
  assert int(table(out)["temperature"][0]) == 1
  assert "valid True" in out
  assert f"{best:>8} {8:>7} {1.0:>7.4f} {1.0:>7.4f}" in out  # every one of the 8 draws


def test_penalised_prompt_token_loses_its_lead(capsys):
  best = int(np.argmax(np.asarray(zipf_row(VOCAB, 1.1))))
  main(["--vocab", str(VOCAB), "--prompt-tokens", f"{best},1,2", "--presence-penalty", "100"])
  out = capsys.readouterr().out
  assert "position 3" in out
  assert int(table(out)["penalties"][3]) != best


def test_bad_setting_is_a_usage_error(capsys):
  with pytest.raises(SystemExit):
    main(["--vocab", str(VOCAB), "--top-p", "1.5"])
  assert "top_p" in capsys.readouterr().err


def test_jsample_command_dispatches(capsys, monkeypatch):
  from jsample.__main__ import cli
  from jsample.models import compiled

  kept = []
  monkeypatch.setattr(compiled, "keep_compiled_programs", lambda: kept.append(True))  # JAX's config stays as is

  assert cli(["demo", "--vocab", str(VOCAB), "--temperature", "0"]) == 0
  assert "draw: token" in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit_:
    cli(["generate", "--help"])
  assert exit_.value.code == 0 and kept == [True]
  assert "--max-tokens" in capsys.readouterr().out


def test_help_names_generate_first(capsys):
  from jsample.__main__ import cli

  assert cli(["--help"]) == 0
  out = capsys.readouterr().out
  assert out.index("generate") < out.index("demo")
  assert 'pip install "jsample[gemma]"' in out
