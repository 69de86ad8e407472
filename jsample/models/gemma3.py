"""Gemma 3's forward pass in JAX, with a key/value cache, as llama.cpp runs the GGUF weights.

Each layer: ``x += norm(attention(norm(x)))`` and ``x += norm(ffn(norm(x)))`` (RMSNorm before and after both),
with RMSNorm on every query and key head, rotary positions (half-split, "NeoX"), grouped-query attention scaled by
``1 / sqrt(head_dim)`` and a tanh-GELU gated feed-forward. Every sixth layer (5, 11, 17) attends to the whole
context with RoPE base 1e6; the others see the last 512 positions with base 1e4. Embeddings are scaled by
``sqrt(width)`` and the output layer is the embedding itself. The GGUF's norm weights already hold Gemma's ``+1``.

The cache holds, per layer, the keys and values of past positions in a ring: position ``p`` sits at slot
``p % S``, where ``S`` is the cache length for global layers and ``min(512, S)`` for sliding ones. A decode step
writes one slot per layer and attends over a fixed-size cache, so its cost does not grow with the position.
A prompt is run in one call (:func:`prefill`), which fills the cache.

The layers' weights are stacked, sliding and global apart (``[15, ...]`` and ``[3, ...]``), and each run of
sliding layers is a ``fori_loop`` that indexes its layer's weights: one compiled layer body per kind, and no copy
of a whole group's weights per iteration as a nested ``scan`` would make.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jsample.models import weights as weights_lib


class Config(NamedTuple):
  """Gemma 3's sizes, from the GGUF metadata (plus the two facts llama.cpp hard-codes for Gemma 3)."""

  vocab: int
  width: int
  layers: int
  heads: int
  kv_heads: int
  head_dim: int
  ffn: int
  eps: float
  window: int
  context: int
  rope_global: float
  rope_local: float = 10_000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3
  pattern: int = 6  # llama.cpp: every sixth layer is global, the rest slide

  @property
  def groups(self) -> int:
    """Repeats of ``pattern - 1`` sliding layers and one global layer."""
    return self.layers // self.pattern

  @classmethod
  def from_metadata(cls, meta: dict) -> "Config":
    """Reads the sizes from GGUF metadata (``gemma3.*`` keys)."""
    arch = meta["general.architecture"]
    if arch != "gemma3":
      raise ValueError(f"not a Gemma 3 file: general.architecture is {arch!r}")
    if meta[f"{arch}.attention.key_length"] != meta[f"{arch}.attention.value_length"]:
      raise ValueError("keys and values of different sizes are not supported")
    config = cls(
      vocab=int(meta["vocab_size"]),
      width=meta[f"{arch}.embedding_length"],
      layers=meta[f"{arch}.block_count"],
      heads=meta[f"{arch}.attention.head_count"],
      kv_heads=meta[f"{arch}.attention.head_count_kv"],
      head_dim=meta[f"{arch}.attention.key_length"],
      ffn=meta[f"{arch}.feed_forward_length"],
      eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"],
      window=meta[f"{arch}.attention.sliding_window"],
      context=meta[f"{arch}.context_length"],
      rope_global=meta[f"{arch}.rope.freq_base"],
    )
    if config.layers % config.pattern:
      raise ValueError(f"{config.layers} layers do not repeat the {config.pattern}-layer pattern")
    return config


class Cache(NamedTuple):
  """Keys and values of past positions.

  Attributes:
    local_k, local_v: ``[N_local, B, S_local, KV, D]``, the sliding layers in order.
    global_k, global_v: ``[N_global, B, S, KV, D]``, the global layers in order.
  """

  local_k: jax.Array
  local_v: jax.Array
  global_k: jax.Array
  global_v: jax.Array


_LAYER: tuple[str, ...] = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output")
_LAYER += ("post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")


def params_from(tensors: dict[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
  """GGUF tensors in the forward pass's layout, flat: ``local.NAME`` ``[N_local, ...]`` and ``global.NAME``
  ``[N_global, ...]`` (layers in order), ``embed`` and ``final_norm``."""
  is_global = np.arange(config.layers) % config.pattern == config.pattern - 1
  flat = {"embed": tensors["token_embd.weight"], "final_norm": tensors["output_norm.weight"]}
  for name in _LAYER:
    layers = [tensors[f"blk.{i}.{name}.weight"] for i in range(config.layers)]
    flat[f"local.{name}"] = np.stack([a for a, g in zip(layers, is_global, strict=True) if not g])
    flat[f"global.{name}"] = np.stack([a for a, g in zip(layers, is_global, strict=True) if g])
  return flat


def _nest(flat: dict) -> dict:
  nested: dict = {}
  for name, array in flat.items():
    *path, leaf = name.split(".")
    node = nested
    for key in path:
      node = node.setdefault(key, {})
    node[leaf] = array
  return nested


@functools.partial(jax.tree_util.register_dataclass, data_fields=["params"], meta_fields=["config"])
@dataclasses.dataclass(frozen=True)
class Gemma3:
  """A loaded model, a pytree: its parameters (arrays) and its :class:`Config` (static); see :func:`load`."""

  config: Config
  params: dict


def load(cache=None) -> tuple[Gemma3, dict]:
  """Gemma 3 270M on the default device, with its GGUF metadata and vocabulary.

  The first call reads and dequantizes the GGUF file and caches the result (about 25 s); later calls read the
  cache (about 1 s). See :mod:`jsample.models.weights`.

  Args:
    cache: the cache root (default: ``$XDG_CACHE_HOME/jsample`` or ``~/.cache/jsample``).

  Returns:
    ``(model, extras)``: a :class:`Gemma3`, and ``extras`` with ``metadata`` (dict) and ``vocabulary``
    (:class:`jsample.models.weights.Vocabulary`).

  Raises:
    jsample.models.weights.MissingExtra: the ``gemma`` extra is not installed.
  """

  def arrange(file: weights_lib.Model) -> weights_lib.Model:
    return file._replace(tensors=params_from(file.tensors, _config(file)))

  file = weights_lib.gemma3_270m(cache, arrange=arrange, layout="jax-stacked")
  params = jax.tree.map(jnp.asarray, _nest(file.tensors))
  return Gemma3(_config(file), params), {"metadata": file.metadata, "vocabulary": file.vocabulary}


def _config(file: weights_lib.Model) -> Config:
  return Config.from_metadata(dict(file.metadata, vocab_size=len(file.vocabulary.tokens)))


# -- pieces ------------------------------------------------------------------------------------------------------


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  weight = weight.reshape((1,) * (x.ndim - 1) + weight.shape)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """Rotates ``x`` ``[B, L, H, D]`` by ``positions`` ``[B, L]``, pairing dimension ``i`` with ``i + D/2``."""
  half = x.shape[-1] // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[..., None, None] * inv_freq[None, None, None]  # [B, L, 1, D/2]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _linear(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w.T`` for GGUF's ``(out, in)`` matrices."""
  return jnp.einsum("...i,oi->...o", x, w)


def _qkv(p: dict, x: jax.Array, positions: jax.Array, base: float, c: Config):
  """Normed, rotated queries ``[B, L, H, D]`` (already scaled) and keys, values ``[B, L, KV, D]``."""
  b, n = x.shape[:2]
  h = _rms_norm(x, p["attn_norm"], c.eps)
  q = _linear(h, p["attn_q"]).reshape(b, n, c.heads, c.head_dim)
  k = _linear(h, p["attn_k"]).reshape(b, n, c.kv_heads, c.head_dim)
  v = _linear(h, p["attn_v"]).reshape(b, n, c.kv_heads, c.head_dim)
  q = _rope(_rms_norm(q, p["attn_q_norm"], c.eps), positions, base) * c.head_dim**-0.5
  k = _rope(_rms_norm(k, p["attn_k_norm"], c.eps), positions, base)
  return q, k, v


def _attend(q, k, v, visible) -> jax.Array:
  """Grouped-query attention: ``q`` ``[B, L, H, D]``, ``k``/``v`` ``[B, S, KV, D]``, ``visible`` ``[B, L, S]``."""
  b, n, heads, dim = q.shape
  kv = k.shape[2]
  q = q.reshape(b, n, kv, heads // kv, dim)
  scores = jnp.einsum("blkrd,bskd->bkrls", q, k)
  scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
  weights = jax.nn.softmax(scores, axis=-1)
  return jnp.einsum("bkrls,bskd->blkrd", weights, v).reshape(b, n, heads * dim)


def _finish_layer(p: dict, x: jax.Array, attended: jax.Array, c: Config) -> jax.Array:
  """The rest of a layer after attention: output projection, post-norm, residual, gated FFN."""
  x = x + _rms_norm(_linear(attended, p["attn_output"]), p["post_attention_norm"], c.eps)
  h = _rms_norm(x, p["ffn_norm"], c.eps)
  ffn = _linear(jax.nn.gelu(_linear(h, p["ffn_gate"]), approximate=True) * _linear(h, p["ffn_up"]), p["ffn_down"])
  return x + _rms_norm(ffn, p["post_ffw_norm"], c.eps)


def _visible(q_pos: jax.Array, k_pos: jax.Array, window: int | None) -> jax.Array:
  """Which keys each query sees: ``[B, L, S]`` from positions ``[B, L]`` and ``[B, S]`` (``-1``: empty slot)."""
  seen = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
  if window is not None:  # llama.cpp masks a key once the query is `window` positions past it
    seen &= q_pos[:, :, None] - k_pos[:, None, :] < window
  return seen


def _embed(params: dict, tokens: jax.Array, c: Config) -> jax.Array:
  return params["embed"][tokens] * jnp.float32(np.sqrt(c.width))


def logits_of(model: Gemma3, x: jax.Array) -> jax.Array:
  """Next-token logits ``[..., V]`` float32 from final hidden states ``[..., width]`` (the output layer is the
  embedding)."""
  return _linear(_rms_norm(x, model.params["final_norm"], model.config.eps), model.params["embed"])


# -- the layer loop ----------------------------------------------------------------------------------------------


def _layers(model: Gemma3, x: jax.Array, positions: jax.Array, cache, attend):
  """Runs every layer on ``x`` ``[B, L, width]`` at ``positions`` ``[B, L]``.

  ``attend(kind, index, q, k, v, cache) -> (attended [B, L, H * D], cache)`` does the attention of the
  ``index``-th layer of its ``kind`` (``"local"`` or ``"global"``) and whatever it keeps in ``cache``.
  """
  params, c = model.params, model.config
  per_group = c.pattern - 1

  def layer(kind, p, index, x, cache):
    q, k, v = _qkv(p, x, positions, c.rope_global if kind == "global" else c.rope_local, c)
    attended, cache = attend(kind, index, q, k, v, cache)
    return _finish_layer(p, x, attended, c), cache

  for g in range(c.groups):

    def local(i, carry, g=g):
      index = g * per_group + i
      p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False), params["local"])
      return layer("local", p, index, *carry)

    x, cache = jax.lax.fori_loop(0, per_group, local, (x, cache))
    x, cache = layer("global", jax.tree.map(lambda a, g=g: a[g], params["global"]), g, x, cache)
  return x, cache


def _set(cache: "Cache", kind: str, index, k: jax.Array, v: jax.Array) -> "Cache":
  """``cache`` with layer ``index`` of ``kind`` replaced by ``k``, ``v`` (written in place inside the loop)."""
  return cache._replace(
    **{
      f"{kind}_k": getattr(cache, f"{kind}_k").at[index].set(k),
      f"{kind}_v": getattr(cache, f"{kind}_v").at[index].set(v),
    }
  )


# -- whole sequences ---------------------------------------------------------------------------------------------


def _ring(kv: jax.Array, lengths: jax.Array, size: int) -> jax.Array:
  """One layer's keys or values ``[B, L, KV, D]`` of each row's prompt as a ring of ``size`` slots.

  Slot ``s`` holds the latest prompt position ``p`` with ``p % size == s``; slots no position reached stay zero
  (their position is negative, so no query sees them).
  """
  last = lengths[:, None] - 1
  held = last - jnp.mod(last - jnp.arange(size, dtype=jnp.int32)[None], size)  # [B, S]
  ring = jnp.take_along_axis(kv, jnp.clip(held, 0, kv.shape[1] - 1)[:, :, None, None], axis=1)
  return jnp.where((held >= 0)[:, :, None, None], ring, 0.0)


def sequence(model: Gemma3, tokens: jax.Array, lengths: jax.Array | None = None, size: int | None = None):
  """Runs ``tokens`` ``[B, L]`` (positions ``0..L-1``) through every layer, attending within the sequence.

  Args:
    model: the model.
    tokens: ``[B, L]`` int32.
    lengths: ``[B]`` int32 real lengths, for a cache (tokens past them are padding).
    size: ``S``, the cache's length (static), or None for no cache.

  Returns:
    ``(hidden, cache)``: final hidden states ``[B, L, width]``, and the :class:`Cache` of ``size`` positions
    that :func:`decode` continues from (None without ``size``).
  """
  c = model.config
  b, n = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (b, n))
  visible = {"local": _visible(positions, positions, c.window), "global": _visible(positions, positions, None)}
  cache = None if size is None else empty_cache(c, b, size)

  def attend(kind, index, q, k, v, cache):
    if cache is not None:
      ring = getattr(cache, f"{kind}_k").shape[2]
      cache = _set(cache, kind, index, _ring(k, lengths, ring), _ring(v, lengths, ring))
    return _attend(q, k, v, visible[kind]), cache

  return _layers(model, _embed(model.params, tokens, c), positions, cache, attend)


def forward(model: Gemma3, tokens: jax.Array) -> jax.Array:
  """Logits ``[B, L, V]`` at every position of ``tokens`` ``[B, L]``, recomputed from scratch (no cache).

  Example (needs the ``gemma`` extra)::

    model, _ = load()
    logits = jax.jit(forward)(model, jnp.array([[2, 818, 5279]]))  # [1, 3, 262144]
  """
  x, _ = sequence(model, tokens)
  return logits_of(model, x)


def last(x: jax.Array, lengths: jax.Array) -> jax.Array:
  """Each row's hidden state ``[B, width]`` at its last real position, from ``x`` ``[B, L, width]``."""
  return jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]


def prefill(model: Gemma3, tokens: jax.Array, lengths: jax.Array, size: int) -> tuple[jax.Array, Cache]:
  """Runs prompts in one call and builds the cache that :func:`decode` continues from.

  Args:
    model: the model.
    tokens: ``[B, L]`` int32 prompts, right-padded (any id) past each row's length.
    lengths: ``[B]`` int32, each prompt's length, at least 1.
    size: ``S``, the cache's length (static): the most positions a row may reach, prompt included.

  Returns:
    ``(logits, cache)``: the next-token logits ``[B, V]`` after each prompt's last token, and the cache.
  """
  x, cache = sequence(model, tokens, lengths, size)
  return logits_of(model, last(x, lengths)), cache


def empty_cache(config: Config, batch: int, size: int) -> Cache:
  """A cache of ``size`` positions for ``batch`` rows, all slots empty."""
  n_global = config.groups
  local = (config.layers - n_global, batch, min(config.window, size), config.kv_heads, config.head_dim)
  glob = (n_global, batch, size, config.kv_heads, config.head_dim)
  return Cache(jnp.zeros(local), jnp.zeros(local), jnp.zeros(glob), jnp.zeros(glob))


def _slot_positions(position: jax.Array, size: int) -> jax.Array:
  """The position each ring slot ``[B, S]`` holds once ``position`` ``[B]`` is written (``< 0``: none yet)."""
  slots = jnp.arange(size, dtype=jnp.int32)
  return position[:, None] - jnp.mod(position[:, None] - slots[None], size)


def decode(model: Gemma3, token: jax.Array, position: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
  """One token per row: writes its keys and values to the cache and returns the next-token logits.

  Args:
    model: the model.
    token: ``[B]`` int32, the newest token of each row.
    position: ``[B]`` int32, its position (the row's length before it).
    cache: the rows' :class:`Cache`; slots past the position are ignored.

  Returns:
    ``(logits [B, V], cache)``.
  """
  c = model.config
  rows = jnp.arange(token.shape[0])
  q_pos = position[:, None]
  sizes = {"local": cache.local_k.shape[2], "global": cache.global_k.shape[2]}
  visible = {
    "local": _visible(q_pos, _slot_positions(position, sizes["local"]), c.window),
    "global": _visible(q_pos, _slot_positions(position, sizes["global"]), None),
  }

  def attend(kind, index, q, k, v, cache):
    slot = jnp.mod(position, sizes[kind])
    k_all = getattr(cache, f"{kind}_k").at[index, rows, slot].set(k[:, 0])
    v_all = getattr(cache, f"{kind}_v").at[index, rows, slot].set(v[:, 0])
    cache = cache._replace(**{f"{kind}_k": k_all, f"{kind}_v": v_all})
    return _attend(q, k_all[index], v_all[index], visible[kind]), cache

  x, cache = _layers(model, _embed(model.params, token[:, None], c), q_pos, cache, attend)
  return logits_of(model, x[:, 0]), cache
