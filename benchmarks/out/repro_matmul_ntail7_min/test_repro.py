"""Regression test exported by peat_jax (peat.export_repro).

What it checks: that the kernel under test,
    py:escape_shapes:matmul_ntail7@dot_general
called as site
    fwd/Gpt/Block/MultiHeadAttention/Linear/dot_general:0 (dot_general)
on fuzz variant min:n=127:len=1,n=7,m=1,batch=1 of step 0's inputs
    (the smallest input failing as n=127 did, shapes [[2, 40, 128], [128, 127]]), gives an output within the golden
kernel's noise floor: ``peat.testing.assert_matches_golden`` analyzes the
KUT's output against the golden kernel's (``case.npz``, computed by
the lax primitive) and their float64 reference, and fails unless the Detector
calls the difference rounding noise (``pass``). No training run.

When it was exported the KUT's record said: random_value (fail): 1 outliers (14.3%) hold values no flip of up to 3 bits explains better than chance (max error 0.0271, 1.2 x RMS golden); every other element is within rounding

Run it on another implementation (your fix) with
``PEAT_REPRO_KUT=<spec> pytest <this folder>``; ``PEAT_REPRO_PATH`` adds
folders to ``sys.path`` (a ``py:`` KUT's module).
"""

import os

import peat_jax as peat

HERE = os.path.dirname(os.path.abspath(__file__))


def test_kut_matches_golden():
  case = peat.testing.load_repro(HERE)
  out = case.run()
  peat.testing.assert_matches_golden(out, case.golden[0], case.reference,
                                     context=case.context)
