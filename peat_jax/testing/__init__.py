"""Helpers for a kernel repository's own test suite (pytest or any runner).

>>> import peat_jax as peat
>>> def test_my_matmul_trains(tmp_path):
...   peat.testing.assert_kernel_trains(
...       "py:my_kernels:matmul", kernel="dot_general",
...       task="my_model:task", steps=20, campaign_dir=tmp_path)

Private modules: ``_assert`` (:func:`assert_kernel_trains`: a whole
``peat.validate`` campaign whose verdict decides the assertion),
``_golden`` (:func:`assert_matches_golden`: one output against the golden
kernel's and the float64 reference by the Detector's rule, the check of a
test exported by ``peat.export_repro``; :func:`load_repro` reads one) and
``_records`` (:func:`assert_records_close`: a campaign's records against
records stored on another machine, exact where rounding cannot move them,
within stated tolerances where it can).
"""

from peat_jax.testing._assert import KernelTrainingError as KernelTrainingError
from peat_jax.testing._assert import assert_kernel_trains as assert_kernel_trains
from peat_jax.testing._golden import GoldenMismatchError as GoldenMismatchError
from peat_jax.testing._golden import assert_matches_golden as assert_matches_golden
from peat_jax.testing._golden import load_repro as load_repro
from peat_jax.testing._records import FIELD_CLASSES as FIELD_CLASSES
from peat_jax.testing._records import assert_records_close as assert_records_close
from peat_jax.testing._records import records_differences as records_differences
