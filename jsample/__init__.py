"""jsample: exact, fast, reproducible sampling of tokens from logits, in JAX."""

from jsample._src.allowed_tokens import allowed_tokens
from jsample._src.banned_tokens import banned_tokens
from jsample._src.configs import (
  Config,
  dry_breaker_sequences,
  end_of_generation_ids,
  from_generation_config,
  from_gguf,
  from_llama_server,
  from_openai,
)
from jsample._src.draw import Draw
from jsample._src.dry import dry
from jsample._src.epsilon import epsilon
from jsample._src.eta import eta
from jsample._src.logit_bias import logit_bias
from jsample._src.logprobs import Logprobs
from jsample._src.masks import pack as pack_mask
from jsample._src.masks import unpack as unpack_mask
from jsample._src.min_tokens import min_tokens
from jsample._src.mirostat import mirostat
from jsample._src.penalties import penalties
from jsample._src.recipes import gemma, hf, llama_cpp, mirostat_neutral, vllm
from jsample._src.sampler import Sampler, StageView, chain
from jsample._src.sharded import sharded
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, elementwise
from jsample._src.state import SamplerState
from jsample._src.temperature import temperature
from jsample._src.top_n_sigma import top_n_sigma
from jsample._src.truncation import min_p, top_k, top_p
from jsample._src.typical import typical
from jsample._src.xtc import xtc

__version__ = "0.1.0"

__all__ = [
  "Candidates",
  "Config",
  "Context",
  "Draw",
  "Logprobs",
  "Sampler",
  "SamplerState",
  "Setting",
  "Settings",
  "Stage",
  "StageView",
  "allowed_tokens",
  "banned_tokens",
  "chain",
  "dry",
  "dry_breaker_sequences",
  "elementwise",
  "end_of_generation_ids",
  "epsilon",
  "eta",
  "from_generation_config",
  "from_gguf",
  "from_llama_server",
  "from_openai",
  "gemma",
  "hf",
  "llama_cpp",
  "logit_bias",
  "min_p",
  "min_tokens",
  "mirostat",
  "mirostat_neutral",
  "pack_mask",
  "penalties",
  "sharded",
  "temperature",
  "top_k",
  "top_n_sigma",
  "top_p",
  "typical",
  "unpack_mask",
  "vllm",
  "xtc",
]
