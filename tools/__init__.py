"""peat_jax.tools."""
