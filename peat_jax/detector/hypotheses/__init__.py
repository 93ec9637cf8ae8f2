"""The Detector's hypotheses: each error model as tests that predict the
error in magnitude (:data:`HYPOTHESES`), the ranking of the accepted
ones (:func:`decide`) and :func:`detect`, which runs them on one record.
"""

from peat_jax.detector.hypotheses._call import call_template as call_template
from peat_jax.detector.hypotheses._call import diagnose_call as diagnose_call
from peat_jax.detector.hypotheses._detect import detect as detect
from peat_jax.detector.hypotheses._detect import detect_batch as detect_batch
from peat_jax.detector.hypotheses._hypotheses import FAULT_TIERS as FAULT_TIERS
from peat_jax.detector.hypotheses._hypotheses import HYPOTHESES as HYPOTHESES
from peat_jax.detector.hypotheses._hypotheses import Hypothesis as Hypothesis
from peat_jax.detector.hypotheses._hypotheses import applicable as applicable
from peat_jax.detector.hypotheses._hypotheses import hypotheses_table as hypotheses_table
from peat_jax.detector.hypotheses._rank import decide as decide
from peat_jax.detector.hypotheses._rank import is_fault as is_fault
from peat_jax.detector.hypotheses._rank import model_verdict as model_verdict
from peat_jax.detector.hypotheses._triage import triage as triage
