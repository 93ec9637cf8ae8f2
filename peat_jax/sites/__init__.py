"""Sites: every kernel call of a train step, found, named, substituted, tapped.

A *site* is one call of a kernel inside a traced step (docs/sites.md).
Private modules: ``_discovery`` (tracing, walking the jaxpr, stable site
names, selection), ``_composite`` (the ``@peat.composite`` marker of
composite kernels), ``_recognize`` (the standard JAX, Flax and Optax
implementations of composite kernels, marked while peat_jax traces),
``_schedules`` (when a KUT runs: every call, every n-th step, a seeded
fraction), ``_substitution`` (a KUT in place of the golden
kernel at selected sites, and taps of both on identical inputs) and
``_interpreter`` (the one jaxpr interpreter of peat_jax, which both
substitution and the computation injectors run on), ``_pairing``
(backward sites paired with the forward calls they transpose) and
``_backward`` (what ``backward="kut"`` runs at which backward sites: the
KUT's VJP), ``_flat`` (flat traces of a forward function cut at its sites:
frontiers and suffixes, for forward campaigns) and ``_separable`` (whether
a suffix computes each sample of the batch alone).
"""

from peat_jax.sites._composite import composite as composite
from peat_jax.sites._composite import composite_call as composite_call
from peat_jax.sites._composite import composite_of as composite_of
from peat_jax.sites._recognize import KINDS as RECOGNIZED_KINDS
from peat_jax.sites._recognize import recognition as recognition
from peat_jax.sites._discovery import PHASES as PHASES
from peat_jax.sites._discovery import Site as Site
from peat_jax.sites._discovery import SiteTable as SiteTable
from peat_jax.sites._discovery import close_matches as close_matches
from peat_jax.sites._discovery import discover_sites as discover_sites
from peat_jax.sites._discovery import select_sites as select_sites
from peat_jax.sites._discovery import site_regex as site_regex
from peat_jax.sites._discovery import sub_jaxprs as sub_jaxprs
from peat_jax.sites._discovery import trace as trace
from peat_jax.sites._discovery import walk as walk
from peat_jax.sites._interpreter import Visitor as Visitor
from peat_jax.sites._backward import BackwardSite as BackwardSite
from peat_jax.sites._backward import backward_sites as backward_sites
from peat_jax.sites._interpreter import interpret as interpret
from peat_jax.sites._schedules import EveryCall as EveryCall
from peat_jax.sites._schedules import EveryNSteps as EveryNSteps
from peat_jax.sites._schedules import Fraction as Fraction
from peat_jax.sites._substitution import GOLDEN as GOLDEN
from peat_jax.sites._substitution import Substitution as Substitution
from peat_jax.sites._substitution import Tap as Tap
from peat_jax.sites._substitution import substitute as substitute
from peat_jax.sites._substitution import tap as tap
from peat_jax.sites._flat import FlatTrace as FlatTrace
from peat_jax.sites._flat import Suffix as Suffix
from peat_jax.sites._flat import corresponding_vars as corresponding_vars
from peat_jax.sites._flat import evaluate_all as evaluate_all
from peat_jax.sites._flat import evaluate_suffix as evaluate_suffix
from peat_jax.sites._flat import flat_trace as flat_trace
from peat_jax.sites._flat import is_floating as is_floating
from peat_jax.sites._flat import is_var as is_var
from peat_jax.sites._flat import shape_of as shape_of
from peat_jax.sites._flat import suffix as suffix
from peat_jax.sites._separable import MIXED as MIXED
from peat_jax.sites._separable import batch_axes as batch_axes
from peat_jax.sites._separable import leading_batch as leading_batch
from peat_jax.sites._separable import one_sample as one_sample
from peat_jax.sites._separable import separable as separable
