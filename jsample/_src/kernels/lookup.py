"""Window tokens found among a row's candidates, for the stages that act on the window's tokens (penalties, DRY).

The ``N`` candidates are sorted by id once, and each of the ``W`` window tokens is searched among them: a sort
of ``N`` (about ``2K``), not of ``W``, which runs to thousands. On XLA's CPU backend the sort is the costly
step: 64 rows of 1024 int32 ids take about 1.6 ms, 64 rows of 256 about 0.3 ms.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Index(NamedTuple):
  """A row's candidate ids in ascending order (``ids``) and the slot each came from (``slots``)."""

  ids: jax.Array
  slots: jax.Array


def index(ids: jax.Array, vocab: int) -> Index:
  """``ids [N]`` sorted, with the slot each came from.

  Where the vocabulary allows, id and slot travel as one int32 key: XLA's CPU backend sorts a lone int32
  array about ten times faster than a pair of arrays. Ids outside ``[-1, V]`` match no window token either way.

  Examples:
    >>> import jax.numpy as jnp
    >>> found = index(jnp.array([7, 2, 5]), vocab=10)
    >>> found.ids.tolist(), found.slots.tolist()
    ([2, 5, 7], [1, 2, 0])
  """
  (width,) = ids.shape
  slots = jnp.arange(width, dtype=jnp.int32)
  if (vocab + 2) * width >= 2**31:
    ranked, where = lax.sort((ids, slots), num_keys=1)
    return Index(ranked, where)
  key = lax.sort((jnp.clip(ids, -1, vocab) + 1) * width + slots)
  return Index(key // width - 1, key % width)


def find(found: Index, tokens: jax.Array, use: jax.Array, *, branch_free: bool) -> tuple[jax.Array, jax.Array]:
  """The candidate slot holding each of ``tokens [W]`` where ``use``, and whether one does.

  A binary search is a loop: cheap on a CPU, a host round trip per step on a GPU, so the branch-free strategy
  compares every pair instead. (Unrolled on a CPU, it ran no faster inside ``pick`` and made the program
  larger.)

  Returns:
    ``(slot, hit)``, each ``[W]``; ``slot`` is meaningless where ``hit`` is False.

  Examples:
    >>> import jax.numpy as jnp
    >>> found = index(jnp.array([7, 2, 5]), vocab=10)
    >>> slot, hit = find(found, jnp.array([5, 3, 7, -1]), jnp.array([True, True, True, False]), branch_free=False)
    >>> slot[hit].tolist(), hit.tolist()
    ([2, 0], [True, False, True, False])
  """
  (width,) = found.ids.shape
  method = "compare_all" if branch_free else "scan"
  at = jnp.clip(jnp.searchsorted(found.ids, tokens, method=method), 0, width - 1)
  hit = use & (found.ids[at] == tokens)
  return found.slots[jnp.where(hit, at, width - 1)], hit
