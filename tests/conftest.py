"""Shared pytest set-up."""

import os

from absl import flags


def pytest_configure(config):
  del config
  # absl flags are unparsed under pytest; tools' tests parse explicit lists.
  flags.FLAGS.mark_as_parsed()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
