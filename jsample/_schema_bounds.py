"""JSON schemas with the bounds a generator needs: numbers of bounded digits and closed objects.

Pure Python on the schema's dictionaries, before any grammar engine sees it (:mod:`jsample.structured` compiles
the result with llguidance).
"""

import copy
from typing import Any

# Bounds that :func:`bounded_schema` adds: integers of at most 15 digits (below 2**53, so the bound survives
# llguidance reading it as a float; llama.cpp allows 16), numbers with at most 6 fractional digits and no exponent.
LARGEST = 10**15 - 1
FRACTION = 1e-6


def bounded_schema(schema: Any) -> Any:
  """``schema`` with the bounds a generator needs, where the schema sets none itself: every integer of at most 15
  digits, every number of at most 15 integer digits and 6 fractional ones, without exponent, and objects
  (``"type": "object"``) that list their ``properties`` closed to others (as llama.cpp and XGrammar do by default).

  A JSON schema lets a number run on forever, and a small model at a high temperature does (``"age": 18737902600000
  00…`` until the tokens run out); an open object invites made-up keys. The bounds are ``minimum``/``maximum``,
  ``multipleOf`` and ``"additionalProperties": false``, which llguidance compiles into the grammar; what they allow
  is valid under the original schema. Strings and arrays are bounded by the schema's own ``maxLength`` and
  ``maxItems``.

  Examples:
    >>> from jsample._schema_bounds import bounded_schema
    >>> bounded_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0},
    ...                                                  "x": {"type": "number"}}})
    {'type': 'object', 'properties': {'n': {'type': 'integer', 'minimum': 0, 'maximum': 999999999999999}, \
'x': {'type': 'number', 'minimum': -999999999999999, 'maximum': 999999999999999, 'multipleOf': 1e-06}}, \
'additionalProperties': False}
  """
  schema = copy.deepcopy(schema)
  _bound(schema, close=True)
  return schema


def _bound(node: Any, close: bool) -> None:
  if isinstance(node, list):
    for item in node:
      _bound(item, close)
    return
  if not isinstance(node, dict):
    return
  kinds = node.get("type")
  kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
  if kinds & {"integer", "number"}:
    if "minimum" not in node and "exclusiveMinimum" not in node:
      node["minimum"] = -LARGEST
    if "maximum" not in node and "exclusiveMaximum" not in node:
      node["maximum"] = LARGEST
    if "number" in kinds and "multipleOf" not in node:
      node["multipleOf"] = FRACTION
  # An allOf's parts (and a node merged with one or with a $ref) are intersected: closing one would drop the
  # properties the others add.
  merged = {"allOf", "$ref", "additionalProperties", "patternProperties", "unevaluatedProperties"}
  if close and "object" in kinds and isinstance(node.get("properties"), dict) and not merged & node.keys():
    node["additionalProperties"] = False
  for key, value in node.items():
    if key not in ("enum", "const", "default", "examples", "x-guidance"):  # values, not schemas
      _bound(value, close and key != "allOf")
