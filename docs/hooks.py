"""A mkdocs hook: the docstrings' Sphinx roles (:func:`chain`, :class:`Sampler`) shown as plain code names.

The docstrings are Google style and read in a terminal too, where the roles say what a name is; mkdocstrings
renders them as text, so the site drops the role and keeps the name.
"""

import re

ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):(<code>)")


def on_page_content(html: str, **kwargs) -> str:
  return ROLE.sub(r"\1", html)
