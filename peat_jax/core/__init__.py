"""peat_jax.core (facade: filled in by the split step)."""
