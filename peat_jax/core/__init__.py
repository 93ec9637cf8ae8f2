"""Foundations every part of peat_jax reads: its errors.

Private modules: ``_errors`` (the exception types). Everything else in
peat_jax imports from here, never the other way round.
"""

from peat_jax.core._errors import CheckpointError as CheckpointError
from peat_jax.core._errors import PeatError as PeatError
