"""jsample: exact, fast, reproducible sampling of tokens from logits, in JAX."""

from jsample._src.draw import Draw
from jsample._src.masks import pack as pack_mask
from jsample._src.masks import unpack as unpack_mask
from jsample._src.penalties import penalties
from jsample._src.recipes import gemma, hf, llama_cpp
from jsample._src.sampler import Sampler, StageView, chain
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, elementwise
from jsample._src.state import SamplerState
from jsample._src.temperature import temperature
from jsample._src.top_n_sigma import top_n_sigma
from jsample._src.truncation import min_p, top_k, top_p

__version__ = "0.1.0"

__all__ = [
  "Candidates",
  "Context",
  "Draw",
  "Sampler",
  "SamplerState",
  "Setting",
  "Settings",
  "Stage",
  "StageView",
  "chain",
  "elementwise",
  "gemma",
  "hf",
  "llama_cpp",
  "min_p",
  "pack_mask",
  "penalties",
  "temperature",
  "top_k",
  "top_n_sigma",
  "top_p",
  "unpack_mask",
]
