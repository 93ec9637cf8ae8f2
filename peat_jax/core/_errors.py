"""Exception types raised by peat_jax.

Every error names what is wrong (expected vs got, the path or name involved)
and how to fix it.
"""


class PeatError(ValueError):
  """Base class of peat_jax's documented errors (bad input, bad state)."""


class CheckpointError(PeatError):
  """A checkpoint directory is missing, empty, truncated or corrupt."""
