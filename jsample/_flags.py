"""Command-line flags for a sampler's settings, from the settings' own metadata."""

import argparse
from collections.abc import Iterable, Mapping

import numpy as np

from jsample._src.sampler import Sampler
from jsample._src.stage import Setting


def add_setting_flags(parser: argparse.ArgumentParser, recipes: Mapping[str, Sampler]) -> None:
  """One ``--flag`` per scalar setting of the first recipe (``top_p`` -> ``--top-p``), from its :class:`Setting`.

  The help is :attr:`Setting.help` and :attr:`Setting.allowed`, then the default as a number: the first recipe's,
  and each other recipe's where it differs. A flag left out keeps the recipe's default.

  Args:
    parser: the parser to extend.
    recipes: the recipes the command can run, by name, the one whose settings become flags first.

  Examples:
    >>> import argparse, jsample
    >>> p = argparse.ArgumentParser()
    >>> add_setting_flags(p, {"gemma": jsample.gemma(), "llama_cpp": jsample.llama_cpp()})
    >>> [a.help for a in p._actions if a.dest == "top_k"][0].split("; ", 1)[1]
    'any integer (<= 0: off) (default: 64; llama_cpp: 40)'
  """
  (first, sampler), *others = recipes.items()
  for setting in sampler.settings.values():
    if setting.shape:
      continue  # vector settings have no single-value flag
    kind = int if np.dtype(setting.dtype) == np.int32 else float
    default = _number(setting.default)
    differ = [
      f"{name}: {_number(other.settings[setting.name].default)}"
      for name, other in others
      if setting.name in other.settings and _number(other.settings[setting.name].default) != default
    ]
    text = f"{setting.help}; {setting.allowed} (default: {'; '.join([default, *differ])})"
    parser.add_argument("--" + setting.name.replace("_", "-"), type=kind, help=text.replace("%", "%%"))


def _number(value) -> str:
  """A default as the flag would be typed: ``0.95``, ``40``."""
  return f"{np.asarray(value).item():g}"


def chosen_settings(args: argparse.Namespace, settings: Iterable[Setting]) -> dict:
  """The settings given on the command line, by name."""
  return {s.name: getattr(args, s.name) for s in settings if getattr(args, s.name, None) is not None}
