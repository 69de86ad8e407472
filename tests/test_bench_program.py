"""``python -m bench.program``'s counts: every equation found, each one's author, HLO instructions counted."""

import jax
import jax.numpy as jnp
from jax import lax

from bench import program


def test_equations_include_branches_and_bodies():
  def f(x):
    y = lax.cond(x[0] > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
    return lax.fori_loop(0, 3, lambda i, v: v + jnp.sin(v), y)

  every = [eqn.primitive.name for eqn in program.equations(jax.make_jaxpr(f)(jnp.ones(4)).jaxpr)]
  assert {"cond", "mul", "sub", "sin"} <= set(every)
  assert "scan" in every  # a fori_loop of fixed length is a scan


def test_a_small_program_is_measured_and_its_authors_are_jsample_modules():
  row = program.measure("gemma", "cpu", repeats=1, batch=2, vocab=64)
  assert row["equations"] == sum(row["authors"].values()) > 100
  assert row["hlo"] > row["conds"] > 0 and row["seconds"] > 0 and row["bytes_over_logits"] > 1
  assert {"stages/temperature", "stages/truncation", "kernels/cut"} <= set(row["authors"])


def test_hlo_instructions_count_assignments_only():
  text = "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"
  assert program.hlo_instructions(text) == 2
