"""Hostile inputs: each has a documented outcome (README, "Guarantees and limits").

Either a clear ``ValueError`` at construction or trace time, or a defined
in-range result (``Draw.valid`` says whether anything survived): never NaN,
never a crash, never an id outside ``[0, V)``.
"""

import numpy as np
import pytest

import jsample

F32_MAX = float(np.finfo(np.float32).max)


# -- settings that the state's dtype cannot hold ---------------------------------


@pytest.mark.parametrize(
  "settings, name",
  [
    (dict(temperature=1e39), "temperature"),  # float32 overflow: would be +inf
    (dict(frequency_penalty=-1e39), "frequency_penalty"),
    (dict(repeat_penalty=1e-50), "repeat_penalty"),  # rounds to 0, which divides by zero
    (dict(top_k=2**32 + 5), "top_k"),  # int32 wrap: would be 5
    (dict(top_k=np.array([2**40, 3])), "top_k"),  # would wrap to 0, i.e. top-k off
    (dict(top_k=2**31), "top_k"),
  ],
  ids=str,
)
def test_settings_are_checked_as_the_state_holds_them(settings, name):
  sampler = jsample.llama_cpp()
  with pytest.raises(ValueError, match=name):
    sampler.init(seed=[0, 1], **settings)
  with pytest.raises(ValueError, match=name):
    sampler.configure(sampler.init(seed=[0, 1]), **settings)


def test_extreme_settings_that_fit_are_kept_exactly():
  sampler = jsample.llama_cpp()
  state = sampler.init(seed=0, top_k=-(2**31), temperature=F32_MAX, repeat_penalty=1e-38)
  assert int(state.settings["top_k"]) == -(2**31)
  assert float(state.settings["temperature"]) == F32_MAX
  assert float(state.settings["repeat_penalty"]) > 0
