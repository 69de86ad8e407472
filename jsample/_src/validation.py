"""Checks of concrete values: a ``ValueError`` that names the argument, its allowed range and what it got.

Under ``jit`` values are traced and nothing here can see them; :mod:`checked`
states the same conditions with ``checkify`` for a checked sampler, from the
same :attr:`Setting.valid` predicates.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jsample._src.kernels import masks
from jsample._src.kernels.strategy import NAMES as STRATEGIES
from jsample._src.stage import Setting, Stage
from jsample._src.state import SamplerState


def is_concrete(value) -> bool:
  """Whether ``value`` can be read now (it is not traced under ``jit``)."""
  return not isinstance(value, jax.core.Tracer)


def setting(spec: Setting, value, sizes: dict[str, int]) -> None:
  """Raises unless ``value`` is one the state can hold for ``spec``.

  Args:
    spec: the setting.
    value: a scalar, one value per row, or (for vector settings) ``[N]`` / ``[B, N]``.
    sizes: the sampler's static sizes, for :attr:`Setting.at_most`.
  """
  if not is_concrete(value):
    return
  v = np.asarray(value)
  if v.dtype == np.bool_ and spec.dtype == jnp.bool_:
    return
  if not np.issubdtype(v.dtype, np.number):
    raise ValueError(f"{spec.name}: must be a number or an array of numbers; got {v.dtype}")
  # Infinities only where the setting says they mean something (a logit bias of -inf bans).
  odd = ~np.isfinite(v) if np.issubdtype(v.dtype, np.floating) else np.zeros(v.shape, bool)
  if np.any(odd) and (spec.dtype != jnp.float32 or not np.all(np.asarray(spec.valid(v[odd]), bool))):
    infinite = np.array([-np.inf, np.inf], np.float32)
    some = spec.dtype == jnp.float32 and np.any(np.asarray(spec.valid(infinite), bool))
    raise ValueError(f"{spec.name}: must be {spec.allowed if some else 'finite'}; got {value!r}")
  if spec.dtype == jnp.int32 and not np.all(np.mod(v, 1) == 0):
    raise ValueError(f"{spec.name}: must be an integer; got {value!r}")
  # The state holds the value in the setting's dtype: check what it will hold
  # (1e39 overflows float32, 1e-50 rounds to 0, 2**40 wraps in int32).
  info = np.iinfo(np.int32) if spec.dtype == jnp.int32 else np.finfo(np.float32)
  if np.any(~odd & ((v < info.min) | (v > info.max))):
    raise ValueError(f"{spec.name}: must fit in {np.dtype(spec.dtype).name}; got {value!r}")
  stored = v.astype(spec.dtype)
  if not np.all(np.asarray(spec.valid(stored), bool)):
    held = ""
    if np.all(np.asarray(spec.valid(v), bool)):
      held = f", which {np.dtype(spec.dtype).name} holds as {stored.tolist()}"
    raise ValueError(f"{spec.name}: must be {spec.allowed}; got {value!r}{held}")
  if spec.at_most is not None and np.any(v > sizes[spec.at_most]):
    raise ValueError(
      f"{spec.name}: must be <= {spec.at_most}={sizes[spec.at_most]}; got {value!r}. "
      f"Build the sampler with a larger {spec.at_most}."
    )


def rows_of(spec: Setting, value) -> tuple[int, ...]:
  """The batch shape a setting's value implies: ``()`` or ``(B,)``."""
  shape = np.shape(value)
  extra = len(shape) - len(spec.shape)
  if extra not in (0, 1) or shape[extra:] != spec.shape:
    want = "a scalar or one value per row [B]" if not spec.shape else f"{list(spec.shape)} or [B, {spec.shape[0]}]"
    raise ValueError(f"{spec.name}: must be {want}; got shape {shape}")
  return shape[:extra]


def tokens(name: str, ids, vocab_size: int | None, lowest: int) -> None:
  """Token ids must be of an integer dtype and, where concrete, lie in ``[lowest, vocab_size)``."""
  if not jnp.issubdtype(jnp.asarray(ids).dtype, jnp.integer):
    raise ValueError(f"{name}: must be integer token ids; got dtype {jnp.asarray(ids).dtype}")
  if not is_concrete(ids):
    return
  ids = np.asarray(ids)
  if np.any(ids < lowest):
    raise ValueError(f"{name}: token ids must be >= 0" + (" (or -1 for padding)" if lowest < 0 else ""))
  if vocab_size is not None and np.any(ids >= vocab_size):
    raise ValueError(f"{name}: token ids must be in [0, {vocab_size}) (the vocabulary)")


def rows_match(known: dict[str, Setting], state: SamplerState, settings: dict) -> None:
  """New setting values for a single row's ``state`` hold one row, not a batch."""
  rows = state.position.shape
  for name, value in settings.items():
    spec = known.get(name)
    if spec is not None and np.ndim(value) > len(rows) + len(spec.shape):
      raise ValueError(f"{name}: the state holds one row, so give a scalar; got shape {np.shape(value)}")


def logits(x: jax.Array, vocab_size: int | None) -> None:
  """The logits' dtype, rank and width."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"logits: must be float32, bfloat16 or float16; got {x.dtype}")
  if x.ndim not in (1, 2):
    raise ValueError(f"logits: must be [V] or [B, V]; got shape {x.shape}")
  if x.shape[-1] < 1:
    raise ValueError("logits: the vocabulary must hold at least one token")
  if vocab_size is not None and x.shape[-1] != vocab_size:
    raise ValueError(f"logits: width {x.shape[-1]} differs from the sampler's vocab_size={vocab_size}")


def inputs(given: dict, declared: dict[str, str], shape: tuple[int, ...]) -> None:
  """Per-call inputs: each declared by some stage, batched like the logits ``shape``.

  Args:
    given: name -> array, the built-in ``mask`` and ``top_logprobs`` included.
    declared: name -> the stage that reads it.
    shape: the logits' shape.
  """
  for name, value in given.items():
    if name == "mask":
      masks.check(value, shape)
      continue
    if name not in declared and name != "top_logprobs":
      known = sorted({"mask", "top_logprobs", *declared})
      raise ValueError(f"{name}: not an input of this sampler's stages; its inputs are {known}")
    if np.shape(value)[: len(shape) - 1] != shape[:-1]:
      raise ValueError(f"{name}: must have the batch shape {shape[:-1]} of the logits; got {np.shape(value)}")


def chain(stages: tuple[Stage, ...], window_size: int, budget: int, vocab_size: int | None, strategy: str) -> None:
  """Checks a sampler's stages and static sizes as :func:`jsample.chain` receives them."""
  for name, value, least in (("window_size", window_size, 0), ("budget", budget, 1)):
    if value < least:
      raise ValueError(f"{name}: must be >= {least}; got {value}")
  if vocab_size is not None and vocab_size < 1:
    raise ValueError(f"vocab_size: must be >= 1; got {vocab_size}")
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy: must be one of {STRATEGIES}; got {strategy!r}")
  _shared(stages)
  stateful = [stage.name for stage in stages if stage.init_state is not None]
  if len(set(stateful)) < len(stateful):
    raise ValueError(f"stages: stages that keep state need distinct names; got {stateful}")
  first = next((i for i, stage in enumerate(stages) if stage.touches is None), len(stages))
  late = [stage.name for stage in stages[first:] if stage.touches is not None]
  if late:
    raise ValueError(
      f"stages: {late} act on the full row before the cut to candidates, so they must come before "
      f"every other stage; got the order {[stage.name for stage in stages]}"
    )


def _shared(stages: tuple[Stage, ...]) -> None:
  """Stages may share a setting (llama.cpp's one ``min_keep``), if they declare it alike.

  The state holds one value per name, so the declarations must agree on
  everything but ``help``; else which one ``init`` obeys would be arbitrary.
  """
  first: dict[str, tuple[str, Setting]] = {}
  for stage in stages:
    for setting in stage.settings:
      owner, seen = first.setdefault(setting.name, (stage.name, setting))
      differ = [f for f in Setting._fields if f != "help" and not _same(getattr(seen, f), getattr(setting, f))]
      if differ:
        raise ValueError(
          f"stages: {owner!r} and {stage.name!r} both declare the setting {setting.name!r}, which is shared "
          f"only when declared alike; they differ in {differ}"
        )


def _same(a, b) -> bool:
  return a is b or (type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b)))


def state_last(call: str, *args) -> None:
  """Every method takes its arrays first and the state last: a ``TypeError`` that says so, not one from deep
  inside JAX, when a call swaps them."""
  *data, state = args
  if not isinstance(state, SamplerState) or any(isinstance(x, SamplerState) for x in data):
    got = ", ".join(type(x).__name__ for x in args)
    raise TypeError(f"{call}: the state comes last (arrays first, then the SamplerState); got ({got})")
