"""Regression test exported by peat_jax (peat.export_repro).

What it checks: that the kernel under test,
    py:escape_shapes:matmul_gemv@dot_general
called as site
    fwd/Gpt/Block/MultiHeadAttention/Linear/dot_general:0 (dot_general)
on fuzz variant min:rows=1:n=2,len=2 of step 0's inputs
    (the smallest input failing as rows=1 did, shapes [[1, 1, 128], [128, 384]]), gives an output within the golden
kernel's noise floor: ``peat.testing.assert_matches_golden`` analyzes the
KUT's output against the golden kernel's (``case.npz``, computed by
the lax primitive) and their float64 reference, and fails unless the Detector
calls the difference rounding noise (``pass``). No training run.

When it was exported the KUT's record said: indexing (fail): an operand in the other layout: the [K, N] = [2, 2] right operand read as [N, K]: the KUT's median distance to that variant is 1.89e-07 of its distance to the model's kernel in float64 (0.0607 RMS, 2.38e+07x the golden kernel's); fitted on the call's own inputs (the signature alone read approximation, fail)

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
