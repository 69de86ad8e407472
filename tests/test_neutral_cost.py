"""A stage left neutral costs a row no pass over the vocabulary on the full path.

On the CPU strategy the full path runs row by row, and each stage's ``on_row``
puts its ``O(V)`` work behind a ``lax.cond`` on its settings. Work outside that
branch runs on every row, on or off: a mask or an argmax computed before the
branch once cost flat rows under llama.cpp's whole chain about 15% of their
time. The top level of each ``on_row`` jaxpr must therefore hold nothing that
reads or writes a ``[V]`` array but the branch itself.
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


def row_work(stage, settings) -> list[str]:
  """The top-level primitives of ``stage.on_row`` that touch a ``[V]`` array, the branches aside."""
  ctx = Context(
    window=jnp.full(16, -1, jnp.int32),
    position=jnp.int32(0),
    vocab=V,
    bits=jnp.zeros(2, jnp.uint32),
    state=None if stage.init_state is None else stage.init_state(),
  )
  jaxpr = jax.make_jaxpr(lambda x, s: stage.on_row(x, s, ctx))(jnp.zeros(V, jnp.float32), settings).jaxpr
  return [
    eqn.primitive.name
    for eqn in jaxpr.eqns
    if eqn.primitive.name != "cond" and any(getattr(v.aval, "size", 0) >= V for v in [*eqn.invars, *eqn.outvars])
  ]


@pytest.mark.parametrize("name", sorted(set(STAGES) - ALWAYS_ON))
def test_a_neutral_stage_leaves_the_row_to_its_branch(name):
  assert row_work(STAGES[name], neutral(STAGES[name])) == []


def test_the_check_sees_work_outside_the_branch():
  stage = STAGES["top_p"]
  work_first = stage._replace(on_row=lambda x, s, ctx: stage.on_row(x - jnp.max(x), s, ctx))
  assert "reduce_max" in row_work(work_first, neutral(stage))
