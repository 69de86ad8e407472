"""Command-line flags for a sampler's settings, from the settings' own metadata."""

import argparse
from collections.abc import Iterable

import numpy as np

from jsample._src.stage import Setting


def add_setting_flags(parser: argparse.ArgumentParser, settings: Iterable[Setting], default: str) -> None:
  """One ``--flag`` per scalar setting (``top_p`` -> ``--top-p``), its help from :attr:`Setting.help`.

  Args:
    parser: the parser to extend.
    settings: the settings, e.g. ``sampler.settings.values()``.
    default: what the default is, for the help text (``"the Gemma recipe's"``).
  """
  for setting in settings:
    if setting.shape:
      continue  # vector settings have no single-value flag
    kind = int if np.dtype(setting.dtype) == np.int32 else float
    text = f"{setting.help}; {setting.allowed} (default: {default})"
    parser.add_argument("--" + setting.name.replace("_", "-"), type=kind, help=text.replace("%", "%%"))


def chosen_settings(args: argparse.Namespace, settings: Iterable[Setting]) -> dict:
  """The settings given on the command line, by name."""
  return {s.name: getattr(args, s.name) for s in settings if getattr(args, s.name, None) is not None}
