"""
from peat_jax.detector.hypotheses._hypotheses import Hypothesis as Hypothesis
from peat_jax.detector.hypotheses._hypotheses import HYPOTHESES as HYPOTHESES
from peat_jax.detector.hypotheses._hypotheses import FAULT_TIERS as FAULT_TIERS
from peat_jax.detector.hypotheses._hypotheses import applicable as applicable
from peat_jax.detector.hypotheses._hypotheses import hypotheses_table as hypotheses_table
from peat_jax.detector.hypotheses._rank import candidate as candidate
from peat_jax.detector.hypotheses._rank import is_fault as is_fault
from peat_jax.detector.hypotheses._rank import model_verdict as model_verdict
from peat_jax.detector.hypotheses._rank import unknown as unknown
from peat_jax.detector.hypotheses._rank import degenerate as degenerate
from peat_jax.detector.hypotheses._rank import decide as decide
from peat_jax.detector.hypotheses._detect import detect as detect
from peat_jax.detector.hypotheses._detect import detect_batch as detect_batch
from peat_jax.detector.hypotheses._triage import ONE_SIDED_SHARE as ONE_SIDED_SHARE
from peat_jax.detector.hypotheses._triage import NARROW_SHARE as NARROW_SHARE
from peat_jax.detector.hypotheses._triage import triage as triage
from peat_jax.detector.hypotheses import _h_base as _h_base
from peat_jax.detector.hypotheses import _h_port as _h_port
from peat_jax.detector.hypotheses import _h_residual as _h_residual
from peat_jax.detector.hypotheses import _h_whole as _h_whole
"""

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
