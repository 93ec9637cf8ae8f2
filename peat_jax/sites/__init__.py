"""peat_jax.sites (facade: filled in by the split step)."""
