"""Shared data of the report tests."""

import importlib.util
import pathlib

import pytest


@pytest.fixture(scope="module")
def report_campaign_data() -> dict:
  """The realistic data of tests/report/test_report.py (loaded by path:
  real computations, see its campaign_data)."""
  path = pathlib.Path(__file__).with_name("test_report.py")
  spec = importlib.util.spec_from_file_location("_peat_report_data", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.campaign_data()
