"""peat_jax.detector (facade: filled in by the split step)."""
