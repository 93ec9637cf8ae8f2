"""Regression test exported by peat_jax (peat.export_repro).

What it checks: that the kernel under test,
    py:escape_shapes:softmax_tail64_long@softmax
called as site
    fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0 (softmax)
on fuzz variant min:len=192:rows2=1,rows1=1,batch=1 of step 0's inputs
    (the smallest input failing as len=192 did, shapes [[2, 4, 40, 192]]), gives an output within the golden
kernel's noise floor: ``peat.testing.assert_matches_golden`` analyzes the
KUT's output against the golden kernel's (``case.npz``, computed by
the model's own function) and their float64 reference, and fails unless the Detector
calls the difference rounding noise (``pass``). No training run.

When it was exported the KUT's record said: scale (fail): a dropped tail: each row's sum leaves out its last 64 of 192 terms (golden times a factor per row): the KUT's median distance to that variant is 1.98e-07 of its distance to the model's kernel in float64 (0.00452 RMS, 4.66e+06x the golden kernel's); fitted on the call's own inputs (the signature alone read scale, fail)

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
