"""peat_jax.injectors (facade: filled in by the split step)."""
