"""peat_jax.report (facade: filled in by the split step)."""
