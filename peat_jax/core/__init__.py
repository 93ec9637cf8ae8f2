"""Foundations every part of peat_jax reads: errors and number-format facts.

Private modules: ``_errors`` (the exception types), ``_imports`` (the
user's own modules named by KUT specs and tasks), ``_formats`` (unit
roundoff, range and bit layout of every format: the one home of those
facts), ``_slips`` (the slip grammar's vocabulary: :class:`Slip`), ``_mappings`` (compiled code against the kernel's limit on a
process's memory mappings), ``_compile_cache`` (the persistent cache of
compiled executables) and ``_version`` (peat_jax's version). Everything else in peat_jax imports from here,
never the other way round.
"""

from peat_jax.core._compile_cache import default_compilation_cache as default_compilation_cache
from peat_jax.core._compile_cache import ensure_compilation_cache as ensure_compilation_cache
from peat_jax.core._compile_cache import use_compilation_cache as use_compilation_cache
from peat_jax.core._compile_count import count_compilations as count_compilations
from peat_jax.core._errors import CheckpointError as CheckpointError
from peat_jax.core._errors import PeatError as PeatError
from peat_jax.core._formats import DTYPE_CODE as DTYPE_CODE
from peat_jax.core._formats import DTYPE_FORMAT as DTYPE_FORMAT
from peat_jax.core._formats import FORMATS as FORMATS
from peat_jax.core._formats import Format as Format
from peat_jax.core._formats import NARROW_FORMATS as NARROW_FORMATS
from peat_jax.core._formats import format_of as format_of
from peat_jax.core._formats import format_of_code as format_of_code
from peat_jax.core._formats import get_format as get_format
from peat_jax.core._formats import is_floating as is_floating
from peat_jax.core._imports import import_user_module as import_user_module
from peat_jax.core._imports import user_function as user_function
from peat_jax.core._mappings import mapping_use as mapping_use
from peat_jax.core._mappings import release_compiled as release_compiled
from peat_jax.core._slips import APPROXIMATIONS as APPROXIMATIONS
from peat_jax.core._slips import APPROXIMATION_CLASSES as APPROXIMATION_CLASSES
from peat_jax.core._slips import ONLINE_SOFTMAX_KINDS as ONLINE_SOFTMAX_KINDS
from peat_jax.core._slips import PARAMETERS as PARAMETERS
from peat_jax.core._slips import REDUCTION_AXES as REDUCTION_AXES
from peat_jax.core._slips import SLIP_MODES as SLIP_MODES
from peat_jax.core._slips import SLIP_OPS as SLIP_OPS
from peat_jax.core._slips import Slip as Slip
from peat_jax.core._slips import TILE_LATTICE as TILE_LATTICE
from peat_jax.core._slips import check_slip as check_slip
from peat_jax.core._version import VERSION as VERSION
