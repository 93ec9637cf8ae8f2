"""The Detector's calibrations: the tensor, composed, held-out and
invariance case generators, their confusion matrices and the scoring
rules (:func:`is_correct`, false alarms, misses).
"""

from peat_jax.detector.calibration._calibration import BENIGN as BENIGN
from peat_jax.detector.calibration._calibration import CalibrationCase as CalibrationCase
from peat_jax.detector.calibration._calibration import CalibrationRecord as CalibrationRecord
from peat_jax.detector.calibration._calibration import CalibrationResult as CalibrationResult
from peat_jax.detector.calibration._calibration import is_correct as is_correct
from peat_jax.detector.calibration._calibration import reliability as reliability
from peat_jax.detector.calibration._calibration import reliability_table as reliability_table
from peat_jax.detector.calibration._calibration import run_calibration as run_calibration
from peat_jax.detector.calibration._composed import by_base as by_base
from peat_jax.detector.calibration._composed import family as family
from peat_jax.detector.calibration._composed import family_correct as family_correct
from peat_jax.detector.calibration._composed import run_composed_calibration as run_composed_calibration
from peat_jax.detector.calibration._heldout import heldout_tables as heldout_tables
from peat_jax.detector.calibration._heldout import run_heldout as run_heldout
from peat_jax.detector.calibration._heldout import wrong_records as wrong_records
from peat_jax.detector.calibration._invariance_calibration import run_invariance_calibration as run_invariance_calibration
