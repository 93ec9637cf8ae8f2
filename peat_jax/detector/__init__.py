"""The Detector: which error model explains a signature, with evidence.

Every error model is a hypothesis it tests (``_hypotheses``: the
registry; ``_h_whole``, ``_h_residual``, ``_h_base`` and ``_h_port``: the
tests of exact traces, of faults on the residual over the fitted base, of
the base itself and of a port's other constant or form), with typed
evidence (``_evidence``), ranked into a diagnosis by one small function
(``_rank``); ``_detect`` runs them. ``_config`` holds every threshold with
its derivation, ``_facts`` the numbers of one record. Beside them:
``_verdict`` (one verdict over many records), ``_triage`` (the records
the screen decides), ``_training`` (training-level rules), ``_invariance``
(stale outputs, mutated inputs, batch variance, ignored inputs),
calibration on errors of known cause (``_calibration``, ``_composed``,
``_invariance_calibration``) and the held-out split written apart from
it (``_heldout``). docs/detector.md's tables are generated from
``_config`` and ``_hypotheses``.
"""

from peat_jax.detector.calibration import BENIGN as BENIGN
from peat_jax.detector.calibration import CalibrationCase as CalibrationCase
from peat_jax.detector.calibration import CalibrationRecord as CalibrationRecord
from peat_jax.detector.calibration import CalibrationResult as CalibrationResult
from peat_jax.detector.calibration import is_correct as is_correct
from peat_jax.detector.calibration import reliability as reliability
from peat_jax.detector.calibration import reliability_table as reliability_table
from peat_jax.detector.calibration import run_calibration as run_calibration
from peat_jax.detector.calibration import family as family
from peat_jax.detector.calibration import by_base as composed_by_base
from peat_jax.detector.calibration import family_correct as family_correct
from peat_jax.detector.calibration import run_composed_calibration as run_composed_calibration
from peat_jax.detector.facts import CONFIG as CONFIG
from peat_jax.detector.facts import DetectorConfig as DetectorConfig
from peat_jax.detector.facts import config_table as config_table
from peat_jax.detector.hypotheses import detect as detect
from peat_jax.detector.hypotheses import diagnose_call as diagnose_call
from peat_jax.detector.hypotheses import detect_batch as detect_batch
from peat_jax.detector.calibration import heldout_tables as heldout_tables
from peat_jax.detector.calibration import run_heldout as run_heldout
from peat_jax.detector.calibration import wrong_records as wrong_records
from peat_jax.detector.facts import BENIGN_NOISE_RATIO as BENIGN_NOISE_RATIO
from peat_jax.detector.facts import FAULT_MODELS as FAULT_MODELS
from peat_jax.detector.facts import PRECISION_MODELS as PRECISION_MODELS
from peat_jax.detector.facts import Candidate as Candidate
from peat_jax.detector.facts import Context as Context
from peat_jax.detector.facts import Probe as Probe
from peat_jax.detector.hypotheses import HYPOTHESES as HYPOTHESES
from peat_jax.detector.hypotheses import Hypothesis as Hypothesis
from peat_jax.detector.hypotheses import hypotheses_table as hypotheses_table
from peat_jax.detector.facts import Diagnosis as Diagnosis
from peat_jax.detector.facts import host_signature as host_signature
from peat_jax.detector.verdicts import INVARIANCE_MODELS as INVARIANCE_MODELS
from peat_jax.detector.verdicts import GLOSSARY as GLOSSARY
from peat_jax.detector.verdicts import glossary_entry as glossary_entry
from peat_jax.detector.verdicts import glossary_table as glossary_table
from peat_jax.detector.verdicts import verdict_of as verdict_of
from peat_jax.detector.verdicts import verdict_rule as verdict_rule
from peat_jax.detector.verdicts import invariance_candidates as invariance_candidates
from peat_jax.detector.verdicts import with_invariance as with_invariance
from peat_jax.detector.verdicts import named_by_inputs as named_by_inputs
from peat_jax.detector.calibration import run_invariance_calibration as run_invariance_calibration
from peat_jax.detector.hypotheses import triage as triage
from peat_jax.detector.verdicts import BENIGN_TRAINING_LIMIT as BENIGN_TRAINING_LIMIT
from peat_jax.detector.verdicts import BF16_PROXY_LIMIT as BF16_PROXY_LIMIT
from peat_jax.detector.verdicts import benign_far_below as benign_far_below
from peat_jax.detector.verdicts import TREND_FACTOR as TREND_FACTOR
from peat_jax.detector.verdicts import TREND_MIN_STEPS as TREND_MIN_STEPS
from peat_jax.detector.verdicts import noise_trend as noise_trend
from peat_jax.detector.verdicts import weights_verdict as weights_verdict
from peat_jax.detector.verdicts import FAIL_ON as FAIL_ON
from peat_jax.detector.verdicts import LOCALIZE_NOISE_RATIO as LOCALIZE_NOISE_RATIO
from peat_jax.detector.verdicts import VERDICTS as VERDICTS
from peat_jax.detector.verdicts import Verdict as Verdict
from peat_jax.detector.verdicts import diagnosis_of as diagnosis_of
from peat_jax.detector.verdicts import diagnosis_record as diagnosis_record
from peat_jax.detector.verdicts import localize as localize
from peat_jax.detector.verdicts import reaches as reaches
from peat_jax.detector.verdicts import severity as severity
from peat_jax.detector.verdicts import verdict as verdict
from peat_jax.detector.verdicts import variants_verdict as variants_verdict
from peat_jax.detector.verdicts import worst as worst
