"""PyTorch bridge (installed as ``peat_jax.bridges``); imports torch lazily."""
