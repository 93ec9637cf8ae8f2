"""The slip grammar: every small perturbation of a golden computation a
port makes, emulated in float64 for the port probe.

Private modules: ``_numerics`` (roundings, reductions, the online
softmax), ``_library`` (the known approximations), ``_families`` (each
composite kind's computation with the places a slip changes),
``_call`` (a call's array arguments, their names and axis roles),
``_variant`` (the probe's hypothesis type), ``_fit`` (refitting a
constant), ``_operands``, ``_constants``, ``_reductions`` and
``_approximations`` (the slips of each category), ``_grammar`` (a
call's slips as probe hypotheses, compositions on a precision base) and
``_subcall`` (a large call searched on a slice of itself).
The vocabulary (``peat.core.Slip``) is shared with the injectors that
make the same slips at working precision.
"""

from peat_jax.analyzer.slips._call import Call as Call
from peat_jax.analyzer.slips._call import make_call as make_call
from peat_jax.analyzer.slips._constants import MIN_ELEMENTS as MIN_ELEMENTS
from peat_jax.analyzer.slips._families import FAMILIES as FAMILIES
from peat_jax.analyzer.slips._families import Hooks as Hooks
from peat_jax.analyzer.slips._families import evaluate as evaluate_family
from peat_jax.analyzer.slips._grammar import CATEGORIES as CATEGORIES
from peat_jax.analyzer.slips._grammar import category_of as category_of
from peat_jax.analyzer.slips._grammar import grammar_table as grammar_table
from peat_jax.analyzer.slips._grammar import slip_variants as slip_variants
from peat_jax.analyzer.slips._grammar import split_name as split_name
from peat_jax.analyzer.slips._library import LIBRARY_BOUND as LIBRARY_BOUND
from peat_jax.analyzer.slips._library import MEMBERS as LIBRARY
from peat_jax.analyzer.slips._numerics import round_mode as round_mode
from peat_jax.analyzer.slips._subcall import SEARCH_ELEMENTS as SEARCH_ELEMENTS
from peat_jax.analyzer.slips._subcall import sub_call as sub_call
from peat_jax.analyzer.slips._variant import Variant as Variant
from peat_jax.analyzer.slips._variant import f64 as f64
