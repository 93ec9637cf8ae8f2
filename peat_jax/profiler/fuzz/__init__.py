"""Fuzzing from real inputs, and a regression test for the kernel's repository.

Private modules: ``_variants`` (variants of a site's captured real inputs:
batch, rows, lengths, joint shapes, magnitudes; ``_lattice``: the lengths
an axis takes and the joint variants; ``_attention``: attention's lengths,
masks, packing, KV heads and head dims), ``_goldens`` (the golden kernel of
a variant: the primitive, the site's marked function or its kind's
standard golden), ``_fuzz`` (:func:`fuzz`: the KUT on every variant through
the Analyzer and the Detector, ``fuzz.msgpack``; ``_coverage``: what a budget covered, per family) and
``_repro``
(:func:`export_repro`: one record's inputs, golden outputs, float64
reference and a pytest file, with no training run).
"""

from peat_jax.profiler.fuzz._coverage import FamilyCoverage as FamilyCoverage
from peat_jax.profiler.fuzz._coverage import coverage as coverage
from peat_jax.profiler.fuzz._coverage import coverage_line as coverage_line
from peat_jax.profiler.fuzz._coverage import shape_key as shape_key
from peat_jax.profiler.fuzz._fuzz import FuzzResult as FuzzResult
from peat_jax.profiler.fuzz._fuzz import fuzz as fuzz
from peat_jax.profiler.fuzz._fuzz import targets as targets
from peat_jax.profiler.fuzz._variants import FAMILIES as FUZZ_FAMILIES
from peat_jax.profiler.fuzz._repro import Repro as Repro
from peat_jax.profiler.fuzz._repro import export_repro as export_repro
from peat_jax.profiler.fuzz._repro import load_repro as load_repro
