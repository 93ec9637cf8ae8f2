"""peat_jax: validate new DNN kernel implementations inside real JAX training.

The public API is re-exported here; implementations live in the private
modules named next to each import.
"""

from peat_jax._analyzer import Signature as Signature
from peat_jax._analyzer import SignatureState as SignatureState
from peat_jax._analyzer import analyze as analyze
from peat_jax._analyzer import analyze_batch as analyze_batch
from peat_jax._analyzer import signature_finalize as signature_finalize
from peat_jax._analyzer import signature_init as signature_init
from peat_jax._analyzer import signature_pure as signature_pure
from peat_jax._analyzer import signature_update as signature_update
from peat_jax._checkpoint import saved_steps as saved_steps
from peat_jax._composite import composite as composite
from peat_jax._composite import composite_call as composite_call
from peat_jax._errors import CheckpointError as CheckpointError
from peat_jax._detector import Candidate as Candidate
from peat_jax._detector import Diagnosis as Diagnosis
from peat_jax._detector import Verdict as Verdict
from peat_jax._detector import detect as detect
from peat_jax._detector import detect_batch as detect_batch
from peat_jax._detector import verdict as verdict
from peat_jax._errors import PeatError as PeatError
from peat_jax._golden import GoldenResult as GoldenResult
from peat_jax._golden import abstract_state as abstract_state
from peat_jax._golden import golden_train as golden_train
from peat_jax._golden import read_log as read_log
from peat_jax._golden import restore_state as restore_state
from peat_jax._inject import COMPUTATION_ERROR_MODELS as COMPUTATION_ERROR_MODELS
from peat_jax._inject import ERROR_MODELS as ERROR_MODELS
from peat_jax._inject import TENSOR_ERROR_MODELS as TENSOR_ERROR_MODELS
from peat_jax._inject import Campaign as Campaign
from peat_jax._inject import InjectGradientsState as InjectGradientsState
from peat_jax._inject import InjectionRecord as InjectionRecord
from peat_jax._inject import bit_probabilities as bit_probabilities
from peat_jax._inject import campaign as campaign
from peat_jax._inject import inject as inject
from peat_jax._inject import inject_gradients as inject_gradients
from peat_jax._inject import inject_tree as inject_tree
from peat_jax._inject import injecting_kernel as injecting_kernel
from peat_jax._inject import injection_params as injection_params
from peat_jax._inject import kernel_campaign as kernel_campaign
from peat_jax._inject import replay as replay
from peat_jax._reference import REFERENCES as REFERENCES
from peat_jax._reference import reference as reference
from peat_jax._reference import reference_attention as reference_attention
from peat_jax._reference import reference_conv as reference_conv
from peat_jax._reference import reference_cross_entropy as reference_cross_entropy
from peat_jax._reference import reference_dot_general as reference_dot_general
from peat_jax._reference import reference_gelu as reference_gelu
from peat_jax._reference import reference_layer_norm as reference_layer_norm
from peat_jax._reference import reference_matmul as reference_matmul
from peat_jax._reference import reference_softmax as reference_softmax
from peat_jax._report import ReportPaths as ReportPaths
from peat_jax._report import write_report as write_report
from peat_jax._sites import Site as Site
from peat_jax._sites import SiteTable as SiteTable
from peat_jax._sites import discover_sites as discover_sites
from peat_jax._sites import select_sites as select_sites
from peat_jax._sites_subst import GOLDEN as GOLDEN
from peat_jax._sites_subst import EveryCall as EveryCall
from peat_jax._sites_subst import EveryNSteps as EveryNSteps
from peat_jax._sites_subst import Fraction as Fraction
from peat_jax._sites_subst import Substitution as Substitution
from peat_jax._sites_subst import Tap as Tap
from peat_jax._sites_subst import substitute as substitute
from peat_jax._sites_subst import tap as tap
from peat_jax._train_state import TrainState as TrainState
from peat_jax._train_state import TrainTask as TrainTask

__version__ = "0.1.0"
