"""peat_jax.models."""
