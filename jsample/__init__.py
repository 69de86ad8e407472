"""jsample: exact, fast, reproducible sampling of tokens from logits, in JAX."""

from jsample._src.draw import Draw
from jsample._src.explain import StageView
from jsample._src.kernels.masks import pack as pack_mask
from jsample._src.kernels.masks import unpack as unpack_mask
from jsample._src.kernels.search import shortest_prefix
from jsample._src.logprobs import Logprobs
from jsample._src.readers.fields import Config
from jsample._src.readers.gguf import from_gguf
from jsample._src.readers.llama_server import from_llama_server
from jsample._src.readers.llama_vocab import dry_breaker_sequences, end_of_generation_ids
from jsample._src.readers.openai import from_openai
from jsample._src.readers.transformers import from_generation_config
from jsample._src.recipes import chain, gemma, hf, llama_cpp, mirostat_neutral, vllm
from jsample._src.sampler import Sampler
from jsample._src.sharded import sharded
from jsample._src.stage import Candidates, Context, Setting, Settings, Stage, elementwise
from jsample._src.stages.dry import dry
from jsample._src.stages.floors import epsilon, eta
from jsample._src.stages.logit_bias import logit_bias
from jsample._src.stages.min_tokens import min_tokens
from jsample._src.stages.mirostat import mirostat
from jsample._src.stages.penalties import penalties
from jsample._src.stages.temperature import temperature
from jsample._src.stages.token_lists import allowed_tokens, banned_tokens
from jsample._src.stages.top_n_sigma import top_n_sigma
from jsample._src.stages.truncation import min_p, top_k, top_p
from jsample._src.stages.typical import typical
from jsample._src.stages.xtc import xtc
from jsample._src.state import SamplerState

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
  "shortest_prefix",
  "temperature",
  "top_k",
  "top_n_sigma",
  "top_p",
  "typical",
  "unpack_mask",
  "vllm",
  "xtc",
]
