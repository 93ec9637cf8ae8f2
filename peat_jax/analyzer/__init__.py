"""peat_jax.analyzer (facade: filled in by the split step)."""
