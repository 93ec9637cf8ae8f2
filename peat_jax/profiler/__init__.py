"""peat_jax.profiler (facade: filled in by the split step)."""
