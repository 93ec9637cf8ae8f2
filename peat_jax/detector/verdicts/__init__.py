"""The Detector's verdicts: pass/warn/fail of one diagnosis and of many
records, the training-level rules and the invariance findings folded
into a record's diagnosis.
"""

from peat_jax.detector.verdicts._glossary import GLOSSARY as GLOSSARY
from peat_jax.detector.verdicts._glossary import entry as glossary_entry
from peat_jax.detector.verdicts._glossary import glossary_table as glossary_table
from peat_jax.detector.verdicts._glossary import verdict_of as verdict_of
from peat_jax.detector.verdicts._glossary import verdict_rule as verdict_rule
from peat_jax.detector.verdicts._invariance import INVARIANCE_FAULTS as INVARIANCE_FAULTS
from peat_jax.detector.verdicts._invariance import INVARIANCE_MODELS as INVARIANCE_MODELS
from peat_jax.detector.verdicts._invariance import invariance_candidates as invariance_candidates
from peat_jax.detector.verdicts._invariance import with_invariance as with_invariance
from peat_jax.detector.verdicts._inputs import named_by_inputs as named_by_inputs
from peat_jax.detector.verdicts._training import BENIGN_TRAINING_LIMIT as BENIGN_TRAINING_LIMIT
from peat_jax.detector.verdicts._training import BF16_PROXY_LIMIT as BF16_PROXY_LIMIT
from peat_jax.detector.verdicts._training import TREND_FACTOR as TREND_FACTOR
from peat_jax.detector.verdicts._training import TREND_MIN_STEPS as TREND_MIN_STEPS
from peat_jax.detector.verdicts._training import benign_far_below as benign_far_below
from peat_jax.detector.verdicts._training import noise_trend as noise_trend
from peat_jax.detector.verdicts._training import weights_verdict as weights_verdict
from peat_jax.detector.verdicts._verdict import FAIL_ON as FAIL_ON
from peat_jax.detector.verdicts._verdict import LOCALIZE_NOISE_RATIO as LOCALIZE_NOISE_RATIO
from peat_jax.detector.verdicts._verdict import VERDICTS as VERDICTS
from peat_jax.detector.verdicts._verdict import Verdict as Verdict
from peat_jax.detector.verdicts._verdict import diagnosis_of as diagnosis_of
from peat_jax.detector.verdicts._verdict import diagnosis_record as diagnosis_record
from peat_jax.detector.verdicts._verdict import localize as localize
from peat_jax.detector.verdicts._verdict import reaches as reaches
from peat_jax.detector.verdicts._verdict import severity as severity
from peat_jax.detector.verdicts._verdict import variants_verdict as variants_verdict
from peat_jax.detector.verdicts._verdict import verdict as verdict
from peat_jax.detector.verdicts._verdict import worst as worst
