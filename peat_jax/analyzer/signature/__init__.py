"""Signatures: one read of a pseudo-error's elements, decomposed, finalized.

Private modules, in the order a record flows through them: ``_checks``
(shapes and dtypes, before tracing); ``_signature`` (the
``SignatureState`` and ``Signature`` types and their constants);
``_bits``, ``_elements``, ``_count``, ``_prefix``, ``_pass`` (the pure-JAX
statistics pass: one read of the elements into a mergeable state);
``_native`` (the same pass as a native XLA FFI kernel, CPU); ``_layout``
(a record flat in its size bucket, its rows and columns); ``_select``
(an exact median in a few passes, or traced); ``_decompose`` (the noise-aware
decomposition: a rounding envelope calibrated on the golden kernel, the
outliers beyond it and their structure); ``_screen`` (the triage
screen's envelope facts, from the decomposition's envelope); ``_finalize`` (state ->
:class:`Signature`) and ``_api`` (the jitted entry points: ``analyze``,
``analyze_batch``, ``analyze_split``, the streaming ``signature_*``).
"""

from peat_jax.analyzer.signature._api import analyze as analyze
from peat_jax.analyzer.signature._base import MODES as BASE_MODES
from peat_jax.analyzer.signature._decompose import MATCH_OUTLIERS as MATCH_OUTLIERS
from peat_jax.analyzer.signature._api import analyze_batch as analyze_batch
from peat_jax.analyzer.signature._api import analyze_split as analyze_split
from peat_jax.analyzer.signature._api import analyze_split_many as analyze_split_many
from peat_jax.analyzer.signature._api import decompose_split_many as decompose_split_many
from peat_jax.analyzer.signature._api import decomposition as decomposition
from peat_jax.analyzer.signature._api import screen as screen
from peat_jax.analyzer.signature._api import screen_split_many as screen_split_many
from peat_jax.analyzer.signature._api import with_decomposition as with_decomposition
from peat_jax.analyzer.signature._screen import Screen as Screen
from peat_jax.analyzer.signature._api import signature_finalize as signature_finalize
from peat_jax.analyzer.signature._api import signature_init as signature_init
from peat_jax.analyzer.signature._api import signature_pure as signature_pure
from peat_jax.analyzer.signature._api import signature_update as signature_update
from peat_jax.analyzer.signature._api import size_bucket as size_bucket
from peat_jax.analyzer.signature._api import split_on_device as split_on_device
from peat_jax.analyzer.signature._checks import split_reference as split_reference
from peat_jax.analyzer.signature._select import median as median
from peat_jax.analyzer.signature._select import medians_kept as medians_kept
from peat_jax.analyzer.signature._signature import HIST_BUCKETS as HIST_BUCKETS
from peat_jax.analyzer.signature._signature import LANES as LANES
from peat_jax.analyzer.signature._signature import NARROW_FORMATS as NARROW_FORMATS
from peat_jax.analyzer.signature._signature import PCT_SAMPLE as PCT_SAMPLE
from peat_jax.analyzer.signature._signature import PERCENTILES as PERCENTILES
from peat_jax.analyzer.signature._signature import SHIFT_RANGE as SHIFT_RANGE
from peat_jax.analyzer.signature._signature import Signature as Signature
from peat_jax.analyzer.signature._signature import SignatureState as SignatureState
from peat_jax.analyzer.signature._signature import TILE_SIZES as TILE_SIZES
from peat_jax.analyzer.signature._finalize import relative_to_scale as relative_to_scale
