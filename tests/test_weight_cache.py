"""The weight cache on a tiny synthetic model: written with a manifest, checked when opened, rebuilt when damaged;
and the compiled programs' cache (``jsample generate``'s ``~/.cache/jsample/xla``), whose damaged entry is rebuilt once.

No GGUF file and no ``gemma`` extra needed: :func:`jsample.models.weights.open_cache` takes the build function.
"""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jsample.models import weights


def tiny_model() -> weights.Model:
  tensors = {"embed": np.arange(12, dtype=np.float32).reshape(3, 4), "local.attn_q": np.ones((2, 4, 3), np.float32)}
  vocabulary = weights.Vocabulary(["<bos>", "▁b", "<0x0A>"], np.array([0, -1, -2], np.float32), np.array([3, 1, 6]))
  return weights.Model(tensors, {"gemma3.block_count": 2}, vocabulary)


class Builds:
  """A build function that counts its calls."""

  def __init__(self, error: Exception | None = None):
    self.calls, self.error = 0, error

  def __call__(self) -> weights.Model:
    self.calls += 1
    if self.error:
      raise self.error
    return tiny_model()


def assert_is_tiny(model: weights.Model) -> None:
  want = tiny_model()
  assert sorted(model.tensors) == sorted(want.tensors)
  for name, array in want.tensors.items():
    np.testing.assert_array_equal(model.tensors[name], array)
  assert model.metadata == want.metadata
  assert model.vocabulary.tokens == want.vocabulary.tokens


@pytest.fixture
def folder(tmp_path):
  folder = tmp_path / "tiny-v2"
  weights.write_cache(tiny_model(), folder)
  return folder


def test_first_open_builds_once_and_later_opens_read(tmp_path, capsys):
  folder, build = tmp_path / "tiny-v2", Builds()
  assert_is_tiny(weights.open_cache(folder, build))
  assert_is_tiny(weights.open_cache(folder, build))
  assert build.calls == 1
  err = capsys.readouterr().err
  assert f"building the weight cache {folder}" in err and "writing 4/4 files" in err
  sizes = json.loads((folder / weights.MANIFEST).read_text())
  assert sorted(sizes) == ["embed.npy", "local.attn_q.npy", "metadata.json", "vocabulary.npz"]
  assert all(sizes[name] == (folder / name).stat().st_size for name in sizes)
  assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no staging folder left behind


def test_truncated_array_is_detected_and_rebuilt(folder, capsys):
  size = (folder / "embed.npy").stat().st_size
  os.truncate(folder / "embed.npy", size - 8)
  with pytest.raises(ValueError, match="mmap length is greater than file size"):  # the user's report
    weights.read_cache(folder)
  assert weights.check_cache(folder) == f"embed.npy is {size - 8} bytes, {size} expected"

  build = Builds()
  assert_is_tiny(weights.open_cache(folder, build))
  assert build.calls == 1
  (line,) = capsys.readouterr().err.splitlines()[:1]
  assert line == f"jsample: the weight cache {folder} is damaged (embed.npy is {size - 8} bytes, {size} expected); " + (
    "rebuilding it"
  )
  assert weights.check_cache(folder) is None
  assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the damaged copy is gone too


def delete(path):
  path.unlink()


def truncate_to_nothing(path):
  os.truncate(path, 0)


def scramble_header(path):  # same size, unreadable header: only reading it shows
  data = bytearray(path.read_bytes())
  data[:10] = b"not an npy"
  path.write_bytes(bytes(data))


@pytest.mark.parametrize(
  "damage, name, problem",
  [
    (delete, "local.attn_q.npy", "local.attn_q.npy is missing"),
    (delete, "manifest.json", "no manifest.json"),
    (truncate_to_nothing, "vocabulary.npz", "vocabulary.npz is 0 bytes"),
    (truncate_to_nothing, "manifest.json", "manifest.json unreadable"),
    (scramble_header, "embed.npy", "unreadable"),
  ],
)
def test_every_damage_is_rebuilt(folder, capsys, damage, name, problem):
  damage(folder / name)
  build = Builds()
  assert_is_tiny(weights.open_cache(folder, build))
  assert build.calls == 1
  err = capsys.readouterr().err
  assert "is damaged (" in err and problem in err and "rebuilding it" in err
  assert weights.check_cache(folder) is None


@pytest.mark.parametrize(
  "error",
  [FileNotFoundError("Missing chunk files: gemma-3-270m-q4_k_m.gguf.part00"), weights.MissingExtra("no gguf")],
  ids=["source-missing", "extra-missing"],
)
def test_unrebuildable_cache_names_the_folder_to_delete(folder, error):
  os.truncate(folder / "embed.npy", 100)
  with pytest.raises(weights.DamagedCache) as raised:
    weights.open_cache(folder, Builds(error))
  message = str(raised.value)
  assert f"the weight cache {folder} is damaged (embed.npy is 100 bytes" in message
  assert str(error) in message and f"delete that folder (rm -r '{folder}')" in message
  assert (folder / "embed.npy").stat().st_size == 100  # left as it was, for the user to delete


def test_unwritable_cache_folder_names_the_folder_to_delete(folder, monkeypatch):
  def no_write(**_):
    raise PermissionError(13, "Permission denied", str(folder.parent))

  monkeypatch.setattr(weights.tempfile, "mkdtemp", no_write)  # as root, chmod would not stop the write
  (folder / "metadata.json").unlink()
  with pytest.raises(weights.DamagedCache, match=f"metadata.json is missing.*Permission denied.*rm -r '{folder}'"):
    weights.open_cache(folder, Builds())


def test_failed_first_build_raises_its_own_error_and_leaves_nothing(tmp_path):
  with pytest.raises(weights.MissingExtra):
    weights.open_cache(tmp_path / "tiny-v2", Builds(weights.MissingExtra("no gguf")))
  assert not list(tmp_path.iterdir())


def test_a_sound_cache_written_meanwhile_is_kept(folder):
  before = (folder / weights.MANIFEST).stat().st_mtime_ns
  weights.write_cache(tiny_model(), folder)  # another process's build finished first: its replace fails
  assert (folder / weights.MANIFEST).stat().st_mtime_ns == before
  assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_the_generate_command_reports_an_unrebuildable_cache(monkeypatch, capsys):
  from jsample.models import generate, text

  def damaged():
    raise weights.DamagedCache("the weight cache /x is damaged (...); delete that folder (rm -r '/x') and run again")

  monkeypatch.setattr(text, "gemma3_270m", damaged)
  assert generate.main(["x"]) == 1
  assert "jsample generate: the weight cache /x is damaged" in capsys.readouterr().err


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_redraws_in_place_on_a_terminal():
  stream = Terminal()
  with weights.Progress("dequantizing", 3, "tensors", stream=stream) as progress:
    for _ in range(3):
      progress.advance()
  shown = stream.getvalue()
  assert shown.startswith("\rjsample: dequantizing 0/3 tensors\rjsample: dequantizing 1/3 tensors\r")
  assert shown.endswith("\rjsample: dequantizing 3/3 tensors (0.0 s)\n") and shown.count("\n") == 1


def test_progress_in_a_log_is_occasional_lines():
  stream = io.StringIO()
  with weights.Progress("writing", 50, "files", stream=stream, every=3600) as progress:
    for _ in range(50):
      progress.advance()
  assert stream.getvalue() == "jsample: writing 50/50 files (0.0 s)\n"


def test_interrupted_progress_ends_its_line():
  stream = Terminal()
  with pytest.raises(KeyboardInterrupt), weights.Progress("writing", 5, "files", stream=stream) as progress:
    progress.advance()
    raise KeyboardInterrupt
  assert stream.getvalue() == "\rjsample: writing 0/5 files\rjsample: writing 1/5 files\n"


COMPILE = """
import sys, jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
from jsample.models.compiled import mending_compiled_programs
with mending_compiled_programs():
  print(jax.jit(lambda x: jnp.cumsum(x) * 2 + 1)(jnp.arange(4)).tolist())
"""


def test_a_damaged_compiled_program_is_removed_and_rebuilt_once(tmp_path):
  def run() -> str:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
      [sys.executable, "-W", "error::UserWarning", "-c", COMPILE, str(tmp_path)],
      capture_output=True,
      text=True,
      check=True,
      cwd=root,
      env=dict(os.environ, PYTHONPATH=str(root)),
    )
    assert done.stdout.strip() == "[1, 3, 7, 13]"
    return done.stderr

  assert "damaged" not in run()
  entries = sorted(tmp_path.glob("*-cache"))
  damaged = []
  for entry in entries:  # a write cut short, its middle overwritten
    data = bytearray(entry.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    damaged.append(bytes(data[:-50]))
    entry.write_bytes(damaged[-1])
  err = run()  # -W error: JAX's warning would fail the run
  assert err.count("removed a damaged compiled program") == len(entries), err
  # Rewritten by the fresh compile (not byte for byte the first one: XLA's serialisation can differ by a few bytes).
  assert all(entry.exists() and entry.read_bytes() != bad for entry, bad in zip(entries, damaged, strict=True))
  assert run() == ""  # and read without a word from then on
