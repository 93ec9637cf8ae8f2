"""Fault injectors: every error model the Detector knows, made on purpose.

Private modules: ``_checks`` (names, keys, parameters, before tracing),
``_api`` (one injection on a tensor), ``_models`` (the tensor error models
and their registry), ``_dense_models`` (the models that move every
element by a function of its value: formats, port patterns), ``_params`` (parameter specs), ``_random``
(counter-based random numbers), ``_rounding`` (rounding into the formats of
:mod:`peat_jax.core`),
``_compute`` (errors of the computation: accumulation, reordering,
nondeterminism), ``_kernel`` (an error model as a kernel under test),
``_trees`` (parameters, gradients, optimizer state), ``_campaigns``
(many seeded injections as one vmapped program), ``_sparse`` (the few
elements a sparse model changes, without a copy of the tensor),
``_forward`` (fault-injection campaigns over a forward function) and
``_slips`` (the slip grammar's slips made at working precision, with the
calls and slips drawn to test the Detector's slip search).
docs/error_models.md, docs/injectors.md.
"""

from peat_jax.injectors._api import bit_probabilities as bit_probabilities
from peat_jax.injectors._api import inject as inject
from peat_jax.injectors._api import injection_params as injection_params
from peat_jax.injectors._campaigns import Campaign as Campaign
from peat_jax.injectors._campaigns import InjectionRecord as InjectionRecord
from peat_jax.injectors._campaigns import campaign as campaign
from peat_jax.injectors._campaigns import kernel_campaign as kernel_campaign
from peat_jax.injectors._campaigns import replay as replay
from peat_jax.injectors._checks import COMPUTATION_ERROR_MODELS as COMPUTATION_ERROR_MODELS
from peat_jax.injectors._checks import ERROR_MODELS as ERROR_MODELS
from peat_jax.injectors._checks import FORMATS as FORMATS
from peat_jax.injectors._checks import TENSOR_ERROR_MODELS as TENSOR_ERROR_MODELS
from peat_jax.injectors._forward import ForwardCampaign as ForwardCampaign
from peat_jax.injectors._forward import ForwardInjection as ForwardInjection
from peat_jax.injectors._forward import forward_campaign as forward_campaign
from peat_jax.injectors._kernel import injecting_kernel as injecting_kernel
from peat_jax.injectors._rounding import kept_rounding as kept_rounding
from peat_jax.injectors._rounding import ROUNDING_MODES as ROUNDING_MODES
from peat_jax.injectors._rounding import round_nearest as round_nearest
from peat_jax.injectors._rounding import round_nearest_away as round_nearest_away
from peat_jax.injectors._rounding import round_to as round_to
from peat_jax.injectors._rounding import round_toward_zero as round_toward_zero
from peat_jax.injectors._trees import InjectGradientsState as InjectGradientsState
from peat_jax.injectors._trees import inject_gradients as inject_gradients
from peat_jax.injectors._trees import inject_tree as inject_tree
from peat_jax.injectors._trees import tree_path as tree_path
from peat_jax.injectors._slips import draw_call as draw_call
from peat_jax.injectors._slips import draw_slip as draw_slip
from peat_jax.injectors._slips import draw_slip_cases as draw_slip_cases
from peat_jax.injectors._slips import golden_call as golden_call
from peat_jax.injectors._slips import golden_value as golden_value
from peat_jax.injectors._slips import names_slip as names_slip
from peat_jax.injectors._slips import slip_from_name as slip_from_name
from peat_jax.injectors._slips import SLIP_KINDS as SLIP_KINDS
from peat_jax.injectors._slips import slip_visibility as slip_visibility
from peat_jax.injectors._slips import SlipCase as SlipCase
from peat_jax.injectors._slips import slipped_call as slipped_call
from peat_jax.injectors._slips import slipped_kernel as slipped_kernel
from peat_jax.injectors._slips import slipped_reference as slipped_reference
from peat_jax.injectors._slips import Visibility as Visibility
