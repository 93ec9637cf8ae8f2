"""The version of peat_jax (what provenance and reports record)."""

#: peat_jax's version: ``peat_jax.__version__`` and the campaign's records.
VERSION = "0.1.0"
