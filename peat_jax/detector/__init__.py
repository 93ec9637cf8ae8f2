"""The Detector: which error model explains a signature, with evidence.

Private modules: ``_facts`` (floating-point facts, the Candidate and
Diagnosis types, the numbers the rules share), ``_rules`` (structural
faults), ``_rounding`` (dense rounding-level errors), ``_detect`` (the
ranking of the rules' candidates into a diagnosis), ``_verdict`` (one
verdict over many records), ``_training`` (training-level rules: a noise
ratio rising over the checkpoints, weights moved beyond the bf16 proxy),
``_calibration`` (confusion matrices on errors of known cause),
``_composed`` (faults planted on a real port's own noise, and port
mismatches), ``_outliers`` (faults read on the outliers of the
noise-aware decomposition), ``_ports`` (another constant or closed
form), ``_triage`` (the records the screen decides before any
decomposition), ``_invariance`` (stale outputs, mutated inputs, batch
variance, ignored inputs) and ``_invariance_calibration`` (their confusion
matrix), ``_heldout`` (the held-out split: a second calibration generator,
written apart from the first, whose cases no threshold is chosen on) and
``_config`` (every threshold, with its derivation). docs/detector.md lists every rule with its
derivation.
"""

from peat_jax.detector._calibration import BENIGN as BENIGN
from peat_jax.detector._calibration import CalibrationCase as CalibrationCase
from peat_jax.detector._calibration import CalibrationRecord as CalibrationRecord
from peat_jax.detector._calibration import CalibrationResult as CalibrationResult
from peat_jax.detector._calibration import is_correct as is_correct
from peat_jax.detector._calibration import reliability as reliability
from peat_jax.detector._calibration import reliability_table as reliability_table
from peat_jax.detector._calibration import run_calibration as run_calibration
from peat_jax.detector._composed import family as family
from peat_jax.detector._composed import by_base as composed_by_base
from peat_jax.detector._composed import family_correct as family_correct
from peat_jax.detector._composed import run_composed_calibration as run_composed_calibration
from peat_jax.detector._detect import detect as detect
from peat_jax.detector._detect import detect_batch as detect_batch
from peat_jax.detector._heldout import heldout_tables as heldout_tables
from peat_jax.detector._heldout import run_heldout as run_heldout
from peat_jax.detector._heldout import wrong_records as wrong_records
from peat_jax.detector._facts import BENIGN_NOISE_RATIO as BENIGN_NOISE_RATIO
from peat_jax.detector._facts import FAULT_MODELS as FAULT_MODELS
from peat_jax.detector._facts import PRECISION_MODELS as PRECISION_MODELS
from peat_jax.detector._facts import Candidate as Candidate
from peat_jax.detector._facts import Diagnosis as Diagnosis
from peat_jax.detector._facts import host_signature as host_signature
from peat_jax.detector._invariance import INVARIANCE_MODELS as INVARIANCE_MODELS
from peat_jax.detector._invariance import invariance_candidates as invariance_candidates
from peat_jax.detector._invariance import with_invariance as with_invariance
from peat_jax.detector._invariance_calibration import run_invariance_calibration as run_invariance_calibration
from peat_jax.detector._triage import triage as triage
from peat_jax.detector._training import BENIGN_TRAINING_LIMIT as BENIGN_TRAINING_LIMIT
from peat_jax.detector._training import BF16_PROXY_LIMIT as BF16_PROXY_LIMIT
from peat_jax.detector._training import benign_far_below as benign_far_below
from peat_jax.detector._training import TREND_FACTOR as TREND_FACTOR
from peat_jax.detector._training import TREND_MIN_STEPS as TREND_MIN_STEPS
from peat_jax.detector._training import noise_trend as noise_trend
from peat_jax.detector._training import weights_verdict as weights_verdict
from peat_jax.detector._verdict import FAIL_ON as FAIL_ON
from peat_jax.detector._verdict import LOCALIZE_NOISE_RATIO as LOCALIZE_NOISE_RATIO
from peat_jax.detector._verdict import VERDICTS as VERDICTS
from peat_jax.detector._verdict import Verdict as Verdict
from peat_jax.detector._verdict import diagnosis_of as diagnosis_of
from peat_jax.detector._verdict import diagnosis_record as diagnosis_record
from peat_jax.detector._verdict import localize as localize
from peat_jax.detector._verdict import reaches as reaches
from peat_jax.detector._verdict import severity as severity
from peat_jax.detector._verdict import verdict as verdict
from peat_jax.detector._verdict import variants_verdict as variants_verdict
from peat_jax.detector._verdict import worst as worst
