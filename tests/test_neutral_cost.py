"""A stage left neutral costs a row no pass over the vocabulary on the full path.

On the CPU strategy the full path runs row by row, and each stage's ``on_row``
puts its ``O(V)`` work behind a ``lax.cond`` on its settings. Work outside that
branch runs on every row, on or off: a mask or an argmax computed before the
branch once cost flat rows under llama.cpp's whole chain about 15% of their
time. The top level of each ``on_row`` jaxpr must therefore hold nothing that
reads or writes a ``[V]`` array but the branch itself.

Where the branch passes the row through unchanged, it must be the ``lax.cond``'s
false branch (index 0): XLA's CPU backend copies a ``[V]`` row returned
unchanged from the true branch, a pass over the row for nothing. Three such
copies per row (top-k, top-p and min-p off) cost flat rows under ``gemma()``
with no truncation about 10% of their time.
"""

import jax
import jax.numpy as jnp
import pytest

import jsample
from jsample._src.stage import Context

V = 4096

RECIPES = (jsample.llama_cpp(), jsample.hf(), jsample.vllm())
STAGES = {stage.name: stage for recipe in RECIPES for stage in recipe.stages}

# Temperature 1 leaves the distribution alone, but the stage still shifts the row by its best logit (which keeps
# (logit - best) / t finite for tiny t): one elementwise pass, which XLA fuses with the next stage's.
ALWAYS_ON = {"temperature"}


def neutral(stage) -> dict:
  return {s.name: jnp.asarray(s.default if s.neutral is None else s.neutral, s.dtype) for s in stage.settings}


def on_row_jaxpr(stage, settings):
  ctx = Context(
    window=jnp.full(16, -1, jnp.int32),
    position=jnp.int32(0),
    vocab=V,
    step_bits=jnp.zeros(2, jnp.uint32),
    state=None if stage.init_state is None else stage.init_state(),
  )
  return jax.make_jaxpr(lambda x, s: stage.on_row(x, s, ctx))(jnp.zeros(V, jnp.float32), settings).jaxpr


def row_work(stage, settings) -> list[str]:
  """The top-level primitives of ``stage.on_row`` that touch a ``[V]`` array, the branches aside."""
  return [
    eqn.primitive.name
    for eqn in on_row_jaxpr(stage, settings).eqns
    if eqn.primitive.name != "cond" and any(getattr(v.aval, "size", 0) >= V for v in [*eqn.invars, *eqn.outvars])
  ]


@pytest.mark.parametrize("name", sorted(set(STAGES) - ALWAYS_ON))
def test_a_neutral_stage_leaves_the_row_to_its_branch(name):
  assert row_work(STAGES[name], neutral(STAGES[name])) == []


def test_the_check_sees_work_outside_the_branch():
  stage = STAGES["top_p"]
  work_first = stage._replace(on_row=lambda x, s, ctx: stage.on_row(x - jnp.max(x), s, ctx))
  assert "reduce_max" in row_work(work_first, neutral(stage))


def pass_through_branches(stage, settings) -> list[int]:
  """The indices of the top-level branches of ``stage.on_row`` that return a ``[V]`` input unchanged."""
  found = []
  for eqn in on_row_jaxpr(stage, settings).eqns:
    for index, branch in enumerate(eqn.params.get("branches", ())):
      inner = branch.jaxpr
      if any(out is var and var.aval.size >= V for out in inner.outvars for var in inner.invars):
        found.append(index)
  return found


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stage_passes_the_row_through_its_false_branch(name):
  assert set(pass_through_branches(STAGES[name], neutral(STAGES[name]))) <= {0}


def test_the_check_sees_a_pass_through_true_branch():
  stage = STAGES["top_k"]
  swapped = stage._replace(on_row=lambda x, s, ctx: jax.lax.cond(s["top_k"] <= 0, lambda: x, lambda: x - 1.0))
  assert pass_through_branches(swapped, neutral(stage)) == [1]
  assert pass_through_branches(stage, neutral(stage)) == [0]
