"""peat_jax: validate new DNN kernel implementations inside real JAX training.

PEAT (arXiv 2609.13544) runs a kernel under test (KUT) operation by
operation inside a real training flow next to the golden kernel. Its parts
and the packages that hold them, lowest layer first (imports point one way):

* foundations: ``peat_jax.core`` (errors, number-format facts);
* sites: ``peat_jax.sites`` (every kernel call of a train step, named,
  substituted and tapped; the one jaxpr interpreter);
* kernels: ``peat_jax.kernels`` (KUT specs, native XLA FFI kernels);
* fault injectors: ``peat_jax.injectors`` (every error model, on purpose);
* the Analyzer: ``peat_jax.analyzer`` (signatures, float64 references);
* the Detector: ``peat_jax.detector`` (error models, verdicts, calibration);
* the report: ``peat_jax.report`` (report data, HTML page, charts);
* the Profiler: ``peat_jax.profiler`` (golden runs and checkpoints,
  playback FI, runtime FI, captures, Monitor, isolation, scale-out,
  ``validate``, ``read_campaign``, ``nnx_task``, ``fuzz``,
  ``export_repro``);
* testing: ``peat_jax.testing`` (``assert_kernel_trains`` and
  ``assert_matches_golden`` for a kernel repository's own test suite).

Every public name is re-exported here from its package's facade; each
package's docstring lists its private modules. ``peat.profile`` is a golden
run with captured site inputs (one of the Profiler's tools), not the whole
Profiler.
"""

from peat_jax.analyzer import Signature as Signature
from peat_jax.analyzer import SignatureState as SignatureState
from peat_jax.analyzer import analyze as analyze
from peat_jax.analyzer import analyze_batch as analyze_batch
from peat_jax.analyzer import signature_finalize as signature_finalize
from peat_jax.analyzer import signature_init as signature_init
from peat_jax.analyzer import signature_pure as signature_pure
from peat_jax.analyzer import signature_update as signature_update
from peat_jax.profiler import CampaignPaths as CampaignPaths
from peat_jax.profiler import PlaybackResult as PlaybackResult
from peat_jax.profiler import RuntimeResult as RuntimeResult
from peat_jax.profiler import playback as playback
from peat_jax.profiler import runtime as runtime
from peat_jax.profiler import validate as validate
from peat_jax.profiler import rebuild_report as rebuild_report
from peat_jax.profiler import ProfileResult as ProfileResult
from peat_jax.profiler import profile as profile
from peat_jax.profiler import saved_steps as saved_steps
from peat_jax.sites import composite as composite
from peat_jax.sites import composite_call as composite_call
from peat_jax.core import CheckpointError as CheckpointError
from peat_jax.profiler import data_parallel_runtime as data_parallel_runtime
from peat_jax.profiler import shard_kut as shard_kut
from peat_jax.detector import Candidate as Candidate
from peat_jax.detector import Diagnosis as Diagnosis
from peat_jax.detector import Verdict as Verdict
from peat_jax.detector import detect as detect
from peat_jax.detector import detect_batch as detect_batch
from peat_jax.detector import verdict as verdict
from peat_jax.core import PeatError as PeatError
from peat_jax.profiler import TaskFactory as TaskFactory
from peat_jax.profiler import check_kut as check_kut
from peat_jax.profiler import Monitor as Monitor
from peat_jax.profiler import GoldenResult as GoldenResult
from peat_jax.profiler import abstract_state as abstract_state
from peat_jax.profiler import golden_train as golden_train
from peat_jax.profiler import read_log as read_log
from peat_jax.profiler import restore_state as restore_state
from peat_jax.injectors import COMPUTATION_ERROR_MODELS as COMPUTATION_ERROR_MODELS
from peat_jax.injectors import ERROR_MODELS as ERROR_MODELS
from peat_jax.injectors import TENSOR_ERROR_MODELS as TENSOR_ERROR_MODELS
from peat_jax.injectors import Campaign as Campaign
from peat_jax.injectors import InjectGradientsState as InjectGradientsState
from peat_jax.injectors import InjectionRecord as InjectionRecord
from peat_jax.injectors import bit_probabilities as bit_probabilities
from peat_jax.injectors import campaign as campaign
from peat_jax.injectors import ForwardCampaign as ForwardCampaign
from peat_jax.injectors import forward_campaign as forward_campaign
from peat_jax.injectors import inject as inject
from peat_jax.injectors import inject_gradients as inject_gradients
from peat_jax.injectors import inject_tree as inject_tree
from peat_jax.injectors import injecting_kernel as injecting_kernel
from peat_jax.injectors import injection_params as injection_params
from peat_jax.injectors import kernel_campaign as kernel_campaign
from peat_jax.injectors import replay as replay
from peat_jax.profiler import OpsResult as OpsResult
from peat_jax.profiler import playback_ops as playback_ops
from peat_jax.profiler import playback_many as playback_many
from peat_jax.profiler import RecordFileError as RecordFileError
from peat_jax.analyzer import REFERENCES as REFERENCES
from peat_jax.analyzer import reference as reference
from peat_jax.analyzer import reference_attention as reference_attention
from peat_jax.analyzer import reference_conv as reference_conv
from peat_jax.analyzer import reference_cross_entropy as reference_cross_entropy
from peat_jax.analyzer import reference_dot_general as reference_dot_general
from peat_jax.analyzer import reference_gelu as reference_gelu
from peat_jax.analyzer import reference_rope as reference_rope
from peat_jax.analyzer import reference_silu as reference_silu
from peat_jax.analyzer import reference_layer_norm as reference_layer_norm
from peat_jax.analyzer import reference_matmul as reference_matmul
from peat_jax.analyzer import reference_softmax as reference_softmax
from peat_jax.report import ReportPaths as ReportPaths
from peat_jax.report import write_report as write_report
from peat_jax.profiler import init_distributed as init_distributed
from peat_jax.profiler import sharded_playback as sharded_playback
from peat_jax.sites import Site as Site
from peat_jax.sites import SiteTable as SiteTable
from peat_jax.sites import discover_sites as discover_sites
from peat_jax.sites import select_sites as select_sites
from peat_jax.sites import GOLDEN as GOLDEN
from peat_jax.sites import EveryCall as EveryCall
from peat_jax.sites import EveryNSteps as EveryNSteps
from peat_jax.sites import Fraction as Fraction
from peat_jax.sites import Substitution as Substitution
from peat_jax.sites import Tap as Tap
from peat_jax.sites import substitute as substitute
from peat_jax.sites import tap as tap
from peat_jax.profiler import TrainState as TrainState
from peat_jax.profiler import TrainTask as TrainTask
from peat_jax.kernels import register_kut as register_kut
from peat_jax.kernels import resolve_kut as resolve_kut
from peat_jax.profiler import nnx_task as nnx_task
from peat_jax.profiler import read_campaign as read_campaign
from peat_jax.profiler import FuzzResult as FuzzResult
from peat_jax.profiler import export_repro as export_repro
from peat_jax.profiler import fuzz as fuzz
from peat_jax import testing as testing

from peat_jax.core import VERSION as __version__
