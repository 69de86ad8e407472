import jax

# equinox's strictness: a silent [B] x [B, V] broadcast or an implicit dtype
# promotion fails the suite instead of producing a wrong token.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
