"""Regression test exported by peat_jax (peat.export_repro).

What it checks: that the kernel under test,
    py:escape_shapes:softmax_tail64@softmax
called as site
    fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0 (softmax)
on fuzz variant len=64 of step 0's inputs, gives an output within the golden
kernel's noise floor: ``peat.testing.assert_matches_golden`` analyzes the
KUT's output against the golden kernel's (``case.npz``, computed by
the model's own function) and their float64 reference, and fails unless the Detector
calls the difference rounding noise (``pass``). No training run.

When it was exported the KUT's record said: scale (fail): t - r = -0.5 r in every row (t = 0.5 r; residual 0 and per-row spread 3.8e-08 far below |-0.5|)

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
