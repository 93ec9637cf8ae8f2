"""The Analyzer's entry points: analyze, analyze_batch, the streaming form.

Each is a jit-compiled executable over the statistics pass (native on CPU,
pure JAX elsewhere: `_accumulate_auto`) and the finalization."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.analyzer.signature._checks import (
    _check_dtype, _check_pair, split_reference)
from peat_jax.analyzer.signature._bits import _from_bits, _uint
from peat_jax.analyzer.signature._native import _accumulate_native, cpu_only
from peat_jax.analyzer.signature._decompose import Decomposition, decompose
from peat_jax.analyzer.signature._finalize import _finalize
from peat_jax.analyzer.signature._layout import (
    Dims, bucket, lines, pad, trim, view2d)
from peat_jax.analyzer.signature._pass import (
    _accumulate, _accumulate_bits, _merge)
from peat_jax.analyzer.signature._screen import Screen, screen_facts
from peat_jax.analyzer.signature._signature import (
    Array, Signature, SignatureState, _bits_of)


# --------------------------------------------------------------------------
# Jitted entry points.
# --------------------------------------------------------------------------


def _accumulate_auto(t: Array, g: Array, ref_hi: Array | None,
                     ref_lo: Array | None) -> SignatureState:
  """The statistics pass for the platform the computation is compiled for.

  On CPU the native pass (`_accumulate_native`), on every other platform
  the pure-JAX pass (`_accumulate`): where JAX runs on CPU alone (its
  default backend), the native pass is traced directly; otherwise
  `lax.platform_dependent` makes the choice when lowering, by platform
  only. (`platform_dependent` traces every branch: on CPU the pure-JAX
  pass, never run there, doubled the tracing of playback's screens, 2.8
  -> 1.5 s for GPT's 13 records.) A failing native call raises, it never
  falls back.
  """
  if cpu_only():
    return _accumulate_native(t, g, ref_hi, ref_lo)
  if ref_hi is None:
    return lax.platform_dependent(
        t, g, cpu=lambda a, b: _accumulate_native(a, b, None, None),
        default=lambda a, b: _accumulate(a, b, None, None))
  return lax.platform_dependent(t, g, ref_hi, ref_lo, cpu=_accumulate_native,
                                default=_accumulate)


def signature_pure(t: Array, g: Array, ref_hi: Array | None = None,
                   ref_lo: Array | None = None) -> Signature:
  """Pure, traceable form of `analyze` (no validation; use inside jit).

  On CPU the statistics pass is the native kernel, elsewhere pure JAX
  (`_accumulate_auto`).

  Args:
    t: test record (validated dtype and shape; see `analyze`).
    g: golden record.
    ref_hi: optional float32 high part of the float64 reference.
    ref_lo: optional float32 low part (reference = ref_hi + ref_lo).

  Returns:
    The `Signature`.
  """
  state = _accumulate_auto(t, g, ref_hi, ref_lo)
  if ref_hi is None:
    return _finalize(state)
  return _finalize(state, decompose(t, g, ref_hi, ref_lo))


# `analyze`: the statistics pass and the finalization in one executable
# (the state's ~55 arrays are never materialized: less per-call overhead).
_analyze_jit = jax.jit(
    lambda t, g: _finalize(_accumulate_auto(t, g, None, None)))
def _screened(sig: Signature, screen: Screen) -> tuple[Signature, Screen]:
  """The screen's Signature holds the Screen's fields too (the
  decomposition's own values; ``decomposed`` stays False, the other
  decomposition fields neutral)."""
  return sig._replace(**screen._asdict()), screen


# What one record computes: the whole Signature, the triage screen (the
# Signature without its decomposition, and the envelope facts), or the
# decomposition alone (of a record the screen flagged); each jitted for one
# record and for many. Traced at the record's own shape (other platforms
# than CPU) ...
_PER_RECORD = {
    "analyze": lambda t, g, hi, lo: _finalize(
        _accumulate_auto(t, g, hi, lo), decompose(t, g, hi, lo)),
    "screen": lambda t, g, hi, lo: _screened(
        _finalize(_accumulate_auto(t, g, hi, lo)),
        screen_facts(t, g, hi, lo)),
    "decompose": decompose,
}
# ... and on CPU flat, padded to the record's size bucket, with its (R, C)
# as an operand (`_layout`): one executable per bucket and dtype, not per
# shape. "signature" is `analyze` without a reference (no decomposition).
_PER_PADDED = {
    "analyze": lambda t, g, hi, lo, d: _finalize(
        _accumulate_native(t, g, hi, lo, d), decompose(t, g, hi, lo, d), d),
    "signature": lambda t, g, hi, lo, d: _finalize(
        _accumulate_native(t, g, None, None, d), dims=d),
    "screen": lambda t, g, hi, lo, d: _screened(
        _finalize(_accumulate_native(t, g, hi, lo, d), dims=d),
        screen_facts(t, g, hi, lo, d)),
    "decompose": decompose,
}
_ONE_JIT = {k: jax.jit(f) for k, f in _PER_RECORD.items()}
_analyze_ref_jit = _ONE_JIT["analyze"]
_MANY_JIT = {k: jax.jit(lambda ts, gs, his, los, f=f: [
    f(t, g, hi, lo) for t, g, hi, lo in zip(ts, gs, his, los)])
             for k, f in _PER_RECORD.items()}
_MANY_PACKED_JIT = {k: jax.jit(lambda ts, gs, his, los, m=m: _pack(
    m(ts, gs, his, los))) for k, m in _MANY_JIT.items()}
_PAD_PACKED_JIT = {k: jax.jit(
    lambda t, g, hi, lo, d, lines, f=f: _pack([f(t, g, hi, lo,
                                                 Dims(d, lines))]),
    static_argnames="lines") for k, f in _PER_PADDED.items()}
_PACK_LAYOUTS: dict = {}  # record shapes/dtypes -> _unpack_plan
# The streaming form: the pass and the finalization separately.
_accumulate_jit = jax.jit(lambda t, g: _accumulate_auto(t, g, None, None))
_accumulate_ref_jit = jax.jit(_accumulate_auto)
_finalize_jit = jax.jit(_finalize)
_merge_jit = jax.jit(_merge)
# The pure-JAX pass on bit patterns made by a separate executable (see
# `_accumulate_bits`): the batched form on every platform, and the
# reference the native pass is tested against.
_bits_jit = jax.jit(lambda x: lax.bitcast_convert_type(x, _uint(x.dtype)))
_accumulate_bits_jit = jax.jit(_accumulate_bits, static_argnames="dtype")
_batch_accumulate_jit = jax.jit(
    lambda ut, ug, dtype: jax.vmap(
        lambda a, b: _accumulate_bits(a, b, None, None, dtype))(ut, ug),
    static_argnames="dtype")
_batch_accumulate_ref_jit = jax.jit(
    lambda ut, ug, hi, lo, dtype: jax.vmap(
        lambda a, b, c, d: _accumulate_bits(a, b, c, d, dtype))(ut, ug, hi,
                                                                lo),
    static_argnames="dtype")
_batch_finalize_jit = jax.jit(jax.vmap(_finalize))
_batch_finalize_dec_jit = jax.jit(jax.vmap(_finalize))
_batch_decompose_jit = jax.jit(
    lambda ut, ug, hi, lo, dtype: jax.vmap(
        lambda a, b, c, d: decompose(
            _from_bits(a, dtype), _from_bits(b, dtype),
            lax.bitcast_convert_type(c, jnp.float32), d))(ut, ug, hi, lo),
    static_argnames="dtype")


def _compiled() -> int:
  """Executables this module's entry points hold (their jit caches)."""
  return sum(f._cache_size() for f in (  # pylint: disable=protected-access
      _analyze_jit, *_ONE_JIT.values(),
      *_MANY_JIT.values(), *_MANY_PACKED_JIT.values(),
      *_PAD_PACKED_JIT.values()))


def _releasing(fn):
  """An entry point that, where its call compiled a new executable (a new
  record shape), releases compiled code once this process uses half its
  memory mappings (`peat_jax.core.release_compiled`): each shape's
  signature maps ~600 kernels, and ~100 distinct shapes in one process
  reach vm.max_map_count, where XLA aborts the process."""

  @functools.wraps(fn)
  def call(*args, **kwargs):
    before = _compiled()
    out = fn(*args, **kwargs)
    if _compiled() > before:
      _core.release_compiled()
    return out
  return call


def _x64_scope(dtype):
  """float64 records need x64 inside the trace (scoped, not global)."""
  if np.dtype(dtype) == np.float64:
    return jax.enable_x64(True)
  return _Null()


class _Null:

  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


def _as_array(x, dtype):
  if isinstance(x, jax.Array):
    return x
  return jnp.asarray(np.asarray(x), dtype=dtype)


@_releasing
def analyze(test, golden, reference=None) -> Signature:
  """Signature of the pseudo-error `test - golden` at one site and step.

  One jit-compiled executable: the statistics pass computes every
  statistic (on CPU the native kernel, elsewhere pure JAX; see
  docs/signature.md) and a small finalization (O(rows + columns) work)
  derives the fields. On CPU the record runs padded to its size bucket
  (:func:`size_bucket`): a call with any shape of a bucket seen before,
  and the same dtype, reuses the executable; elsewhere a call with the
  same shape and dtype does.

  Args:
    test: output of the kernel under test (float32, bfloat16, float16 or
      float64 array, any shape with at least one element).
    golden: output of the golden kernel on identical inputs; same shape and
      dtype as `test`.
    reference: optional float64 (or any float) array of the same shape: the
      same operation computed in float64 (see `peat_jax.analyzer._references`). Adds
      the noise-floor fields.

  Returns:
    A `Signature` of scalar/array fields (see its docstring and
    docs/signature.md).

  Raises:
    PeatError: unsupported dtype, dtype or shape mismatch, empty arrays.

  >>> import jax.numpy as jnp, peat_jax as peat
  >>> g = jnp.linspace(1.0, 2.0, 64, dtype=jnp.float32)
  >>> int(peat.analyze(g, g).n_bit_equal)
  64
  """
  shape, dtype = _check_pair(test, golden, batched=False)
  if _bucketed():
    if reference is None:
      return _padded("signature", test, golden, None, None, shape, dtype)
    hi, lo = split_reference(reference, shape, batched=False)
    return _padded("analyze", test, golden, hi, lo, shape, dtype)
  with _x64_scope(dtype):
    t = _as_array(test, dtype)
    g = _as_array(golden, dtype)
    if reference is None:
      return _analyze_jit(t, g)
    hi, lo = split_reference(reference, shape, batched=False)
    return _analyze_ref_jit(t, g, hi, lo)


def split_on_device(reference: Array) -> tuple[Array, Array]:
  """(hi, lo) float32 double-float of a float64 reference, traced.

  The formulas of the host split in `analyze` (hi = float32(r), lo =
  float32(r - hi), non-finite lo -> 0); trace it with x64 enabled.
  """
  hi = reference.astype(jnp.float32)
  lo = (reference - hi.astype(reference.dtype)).astype(jnp.float32)
  return hi, jnp.where(jnp.isfinite(lo), lo, jnp.float32(0))


def analyze_split(test, golden, ref_hi: Array, ref_lo: Array) -> Signature:
  """`analyze` with the reference given as its float32 (hi, lo) halves.

  For references computed on the device (`split_on_device`): no float64
  array comes to the host. On CPU the record runs in its size bucket, as
  `analyze` (bitwise the same Signature).

  Args:
    test: output of the kernel under test.
    golden: output of the golden kernel, same shape and dtype.
    ref_hi: float32 high half of the float64 reference, same shape.
    ref_lo: float32 low half.

  Returns:
    The Signature, as `analyze(test, golden, hi + lo)`.

  Raises:
    PeatError: as `analyze`; halves of another shape or dtype.
  """
  if _bucketed():
    # A record alone: its size bucket's executable, as `analyze`'s.
    shape, dtype = _check_split(0, test, golden, ref_hi, ref_lo)
    return _padded("analyze", test, golden, ref_hi, ref_lo, shape, dtype)
  return analyze_split_many([test], [golden], [ref_hi], [ref_lo])[0]


def analyze_split_many(tests: Sequence, goldens: Sequence,
                       ref_his: Sequence[Array], ref_los: Sequence[Array],
                       *, to_host: bool = False) -> list[Signature]:
  """`analyze_split` of many records (any shapes) in one executable.

  One dispatch for all of them, and XLA may run their passes concurrently
  (the playback of one checkpoint analyzes all its sites this way). Each
  record runs at its own shape, never padded to its size bucket, whatever
  the count: a campaign's sites keep their shapes from one checkpoint to
  the next, and a record's fields are bitwise the same in a call with it
  alone as with others (`analyze_split` and `analyze` of a record alone
  run in its bucket: the same counts and diagnosis, float sums to their
  summation order).

  Args:
    tests, goldens, ref_his, ref_los: per record, as `analyze_split`
      (a record's two halves None: no reference).
    to_host: return NumPy Signatures, fetched as one array per dtype (a
      few transfers instead of one per field of every record).

  Returns:
    The Signatures, in order (device arrays, or NumPy with ``to_host``).

  Raises:
    PeatError: as `analyze_split`, naming the record's index.
  """
  return _split_many("analyze", tests, goldens, ref_his, ref_los, to_host)


def screen_split_many(tests: Sequence, goldens: Sequence,
                      ref_his: Sequence[Array], ref_los: Sequence[Array],
                      *, to_host: bool = False
                      ) -> list[tuple[Signature, Screen]]:
  """The triage screen of many records (any shapes) in one executable.

  At the records' own shapes, as `analyze_split_many`. Per record the
  Signature without its decomposition (``decomposed``
  False; of its fields only the :class:`Screen`'s five are set, the
  others neutral) and the :class:`Screen` facts; the
  decomposition of the records the screen flags is
  :func:`decompose_split_many`, and :func:`with_decomposition` joins the
  two into the Signature `analyze_split_many` returns.

  Args:
    tests, goldens, ref_his, ref_los: per record, as `analyze_split`
      (a record's two halves None: no reference).
    to_host: return NumPy fields (one transfer per dtype).

  Returns:
    ``(Signature, Screen)`` per record, in order.

  Raises:
    PeatError: as `analyze_split_many`.
  """
  return _split_many("screen", tests, goldens, ref_his, ref_los, to_host)


def decompose_split_many(tests: Sequence, goldens: Sequence,
                         ref_his: Sequence[Array], ref_los: Sequence[Array],
                         *, to_host: bool = False) -> list[Decomposition]:
  """The noise-aware decomposition alone of many records, one executable.

  Args:
    tests, goldens, ref_his, ref_los: per record, as `analyze_split`
      (a record's two halves None: no reference).
    to_host: return NumPy fields (one transfer per dtype).

  Each record runs the one-record executable of its own shape, one after
  the other: the records a screen flags differ from one checkpoint to the
  next, and an executable for each such subset would compile again and
  again. (Not its size bucket's, as `analyze_split_many`: playback's
  flagged records keep their shapes from one checkpoint to the next, and
  a padded decomposition's warm call costs up to twice an exact one's;
  :func:`decomposition` of a lone record uses the bucket.)

  Returns:
    The records' decompositions, in order (see :func:`with_decomposition`).

  Raises:
    PeatError: as `analyze_split_many`.
  """
  got = [_split_many("decompose", [t], [g], [hi], [lo], False)[0]
         for t, g, hi, lo in zip(tests, goldens, ref_his, ref_los)]
  return jax.device_get(got) if to_host else got


def with_decomposition(sig: Signature, dec: Decomposition) -> Signature:
  """A screened Signature completed by its decomposition: the Signature
  `analyze` gives on the same record (the decomposition's fields are
  independent of the rest).

  Args:
    sig: a Signature from the screen (``decomposed`` False).
    dec: that record's decomposition.

  Returns:
    The Signature with the decomposition's fields.
  """
  return sig._replace(**dec._asdict())


def screen(test, golden, reference=None) -> tuple[Signature, Screen]:
  """The triage screen of one record (`screen_split_many` of one).

  Args:
    test, golden, reference: as `analyze`.

  Returns:
    ``(Signature without the decomposition, Screen)``.

  Raises:
    PeatError: as `analyze`.
  """
  return _one("screen", test, golden, reference)


def decomposition(test, golden, reference=None) -> Decomposition:
  """The noise-aware decomposition of one record (the fields `analyze`
  adds to the screen's Signature; :func:`with_decomposition`).

  Args:
    test, golden, reference: as `analyze`.

  Returns:
    Its :class:`Decomposition`.

  Raises:
    PeatError: as `analyze`.
  """
  return _one("decompose", test, golden, reference)


@_releasing
def _one(kind: str, test, golden, reference):
  """One record's `kind` (screen, decompose) from host or device arrays."""
  shape, dtype = _check_pair(test, golden, batched=False)
  if reference is None:
    hi = lo = None
  else:
    hi, lo = split_reference(reference, shape, batched=False)
  if _bucketed():
    return _padded(kind, test, golden, hi, lo, shape, dtype)
  with _x64_scope(dtype):
    t = _as_array(test, dtype)
    g = _as_array(golden, dtype)
    return _ONE_JIT[kind](t, g, hi, lo)


def _check_split(i: int, test, golden, ref_hi, ref_lo) -> tuple:
  """(shape, dtype) of record ``i`` given with its reference's halves
  (both None: no reference)."""
  shape, dtype = _check_pair(test, golden, batched=False)
  if ref_hi is None and ref_lo is None:
    return shape, dtype
  for name, h in (("ref_hi", ref_hi), ("ref_lo", ref_lo)):
    if (tuple(np.shape(h)) != tuple(shape)
        or np.dtype(h.dtype) != np.float32):
      raise PeatError(
          f"record {i}: {name} has shape {tuple(np.shape(h))} and dtype "
          f"{h.dtype}; expected float32 of the test's shape "
          f"{tuple(shape)}. Fix: split the float64 reference with "
          "split_on_device.")
  return shape, dtype


@_releasing
def _split_many(kind: str, tests, goldens, ref_his, ref_los, to_host: bool):
  """`kind` (analyze, screen, decompose) of many records at their own
  shapes, one executable. Never padded, whatever the count: a record's
  fields are bitwise the same in a call of one record or of many."""
  if not len(tests) == len(goldens) == len(ref_his) == len(ref_los):
    raise PeatError("tests, goldens, ref_his and ref_los have lengths "
                    f"{len(tests)}, {len(goldens)}, {len(ref_his)}, "
                    f"{len(ref_los)}; expected one of each per record")
  ts, gs, wide, metas = [], [], False, []
  for i, (t, g, hi, lo) in enumerate(zip(tests, goldens, ref_his, ref_los)):
    metas.append(_check_split(i, t, g, hi, lo))
    wide |= np.dtype(metas[-1][1]) == np.float64
  if not metas:
    return []
  for t, g, (_, dtype) in zip(tests, goldens, metas):
    with _x64_scope(dtype):
      ts.append(_as_array(t, dtype))
      gs.append(_as_array(g, dtype))
  his, los = list(ref_his), list(ref_los)
  with _x64_scope(np.float64 if wide else np.float32):
    if len(ts) == 1:
      # One record: the one-record executable, shared with every call of
      # this shape and dtype (a many-record executable would be one more
      # compilation, and one more set of code mappings kept, per shape).
      out = _ONE_JIT[kind](ts[0], gs[0], his[0], los[0])
      return [jax.device_get(out) if to_host else out]
    if not to_host:
      return list(_MANY_JIT[kind](ts, gs, his, los))
    key = (kind,) + tuple((tuple(t.shape), str(t.dtype), h is None)
                          for t, h in zip(ts, his))
    if key not in _PACK_LAYOUTS:
      _PACK_LAYOUTS[key] = _unpack_plan(
          jax.eval_shape(_MANY_JIT[kind], ts, gs, his, los))
    packed = jax.device_get(_MANY_PACKED_JIT[kind](ts, gs, his, los))
  return _unpack(packed, _PACK_LAYOUTS[key])


def _bucketed() -> bool:
  """Whether records run padded to their size bucket: on CPU, where the
  statistics pass is the native kernel (it reads the record's (R, C) at
  run time); other platforms trace each record shape (the pure-JAX
  pass)."""
  return cpu_only()


def _padded(kind: str, test, golden, ref_hi, ref_lo, shape, dtype):
  """`kind` of one validated record, flat and padded to its size bucket
  (`_layout.bucket`) with its (R, C) as an operand and its rows' and
  columns' slots (`_layout.lines`): one executable per bucket, slot count
  and dtype, whatever the shapes inside them. The result is fetched, cut
  to the record's rows, columns and tiles (`_layout.trim`) and put back
  on the device."""
  rows, cols = view2d(shape)
  cap = bucket(rows * cols)
  slots = lines(cap, rows, cols)
  with _x64_scope(dtype):
    t, g = pad(test, cap, dtype), pad(golden, cap, dtype)
    hi = None if ref_hi is None else pad(ref_hi, cap, np.float32)
    lo = None if ref_lo is None else pad(ref_lo, cap, np.float32)
    d = np.array([rows, cols], np.int32)
    key = ("padded", kind, slots, tuple(t.shape), str(t.dtype), hi is None)
    if key not in _PACK_LAYOUTS:
      _PACK_LAYOUTS[key] = _unpack_plan(jax.eval_shape(
          lambda t, g, hi, lo, d: [_PER_PADDED[kind](t, g, hi, lo,
                                                     Dims(d, slots))],
          t, g, hi, lo, d))
    packed = jax.device_get(_PAD_PACKED_JIT[kind](t, g, hi, lo, d,
                                                  lines=slots))
  (got,) = _unpack(packed, _PACK_LAYOUTS[key])
  return jax.device_put(_trim_result(got, rows, cols))


def size_bucket(shape) -> int:
  """The flat length a record of ``shape`` runs at on this platform.

  On CPU its size bucket (the next power of two of its element count, at
  least 4,096: records of one bucket and dtype share compiled
  executables); elsewhere its own element count (one executable per
  shape).

  Args:
    shape: the record's shape.

  Returns:
    The length.
  """
  n = int(math.prod(shape))
  return bucket(n) if _bucketed() else n


def _trim_result(result, rows: int, cols: int):
  """`_layout.trim` of a result or of a (Signature, Screen) pair."""
  if isinstance(result, tuple) and not hasattr(result, "_fields"):
    return tuple(trim(r, rows, cols) for r in result)
  return trim(result, rows, cols)


def _pack(sigs: list) -> dict[str, Array]:
  """All fields of many records' results (Signatures, screens,
  decompositions) as one flat array per dtype (traced)."""
  groups: dict[str, list[Array]] = {}
  for sig in sigs:
    for leaf in jax.tree.leaves(sig):
      groups.setdefault(str(leaf.dtype), []).append(leaf.reshape(-1))
  return {k: jnp.concatenate(v) for k, v in groups.items()}


def _unpack_plan(layout: list) -> list[tuple]:
  """Where each field of each record's result lies in `_pack`'s arrays:
  ``(tree structure, [(dtype key, start, stop, shape)] per field)`` per
  record."""
  offsets: dict[str, int] = {}
  plan = []
  for sig in layout:
    leaves, treedef = jax.tree.flatten(sig)
    fields = []
    for leaf in leaves:
      k, n = str(leaf.dtype), int(math.prod(leaf.shape))
      start = offsets.get(k, 0)
      offsets[k] = start + n
      fields.append((k, start, start + n, tuple(leaf.shape)))
    plan.append((treedef, fields))
  return plan


def _unpack(packed: dict[str, np.ndarray], plan: list[tuple]) -> list:
  """Inverse of `_pack` on the host, by an `_unpack_plan` (views, no
  copies: a few hundred fields cost well under a millisecond)."""
  return [jax.tree.unflatten(treedef, [packed[k][a:b].reshape(shape)
                                       for k, a, b, shape in fields])
          for treedef, fields in plan]


def analyze_batch(tests, goldens, references=None) -> Signature:
  """Signatures of many records of one shape/dtype in one compiled call.

  The pure-JAX pass, vmapped, on every platform (fed bit patterns from a
  separate executable, see `_accumulate_bits`); its results agree with
  `analyze` record by record (counts exactly, floats to summation order).

  Args:
    tests: array of shape (B, *record_shape): KUT outputs of B (site, step)
      records.
    goldens: golden outputs, same shape and dtype.
    references: optional float64 array (B, *record_shape).

  Returns:
    A `Signature` whose every field has a leading axis of size B.

  Raises:
    PeatError: as `analyze`, or a missing batch axis.
  """
  shape, dtype = _check_pair(tests, goldens, batched=True)
  with _x64_scope(dtype):
    ut = _bits_jit(_as_array(tests, dtype))
    ug = _bits_jit(_as_array(goldens, dtype))
    if references is None:
      return _batch_finalize_jit(_batch_accumulate_jit(ut, ug, dtype=dtype))
    hi, lo = split_reference(references, shape, batched=True)
    hib = jnp.asarray(hi.view(np.uint32))
    return _batch_finalize_dec_jit(
        _batch_accumulate_ref_jit(ut, ug, hib, lo, dtype=dtype),
        _batch_decompose_jit(ut, ug, hib, lo, dtype=dtype))


def signature_init(shape, dtype) -> SignatureState:
  """Empty streaming state for records of `shape` and `dtype`.

  Args:
    shape: record shape (tuple of ints, at least one element).
    dtype: record dtype (float32, bfloat16, float16, float64).

  Returns:
    The identity `SignatureState` (merging it changes nothing).

  Raises:
    PeatError: unsupported dtype or empty shape.
  """
  dtype = _check_dtype(dtype, "dtype")
  shape = tuple(int(s) for s in shape)
  if math.prod(shape) == 0:
    raise PeatError(f"record shape {shape} has no elements; expected at "
                    "least 1. Fix: skip sites whose output is empty.")
  with _x64_scope(dtype):
    z = jnp.zeros(shape, dtype)
    proto = jax.eval_shape(
        lambda a, b: _accumulate(a, b, None, None), z, z)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), proto)
    cdt = state.row_abs_max.dtype
    state = state._replace(
        steps=jnp.int32(0), n=jnp.int32(0),
        ratio_min=jnp.asarray(jnp.inf, cdt),
        ratio_max=jnp.asarray(-jnp.inf, cdt))
  return state


def signature_update(state: SignatureState, test, golden,
                     reference=None) -> SignatureState:
  """Merges one record (site, step) into a streaming state.

  Pure: returns a new state; jit-compiled once per shape and dtype.

  Args:
    state: from `signature_init` or a previous `signature_update`.
    test: KUT output of this step.
    golden: golden output of this step.
    reference: optional float64 reference of this step.

  Returns:
    The updated `SignatureState`.

  Raises:
    PeatError: shape or dtype differ from the state's.
  """
  shape, dtype = _check_pair(test, golden, batched=False)
  rows, cols = view2d(shape)
  have = (state.row_ndiff.shape[0], state.col_ndiff.shape[0])
  if have != (rows, cols):
    raise PeatError(
        f"record shape {shape} (2-D view {(rows, cols)}) does not match the "
        f"state's 2-D view {have}. Fix: keep one state per site (records of "
        "one shape).")
  if _bits_of(dtype) != state.bits_up.shape[0]:
    raise PeatError(
        f"record dtype {dtype} has {_bits_of(dtype)} bits; the state was made"
        f" for {state.bits_up.shape[0]}-bit records. Fix: keep one state per "
        "site and dtype.")
  with _x64_scope(dtype):
    t = _as_array(test, dtype)
    g = _as_array(golden, dtype)
    if reference is None:
      return _merge_jit(state, _accumulate_jit(t, g))
    hi, lo = split_reference(reference, shape, batched=False)
    return _merge_jit(state, _accumulate_ref_jit(t, g, hi, lo))


def signature_finalize(state: SignatureState) -> Signature:
  """Signature of everything merged into `state`.

  Counts and histograms are totals over the merged records; means, RMS and
  shares are over all merged elements. Per-row/column means are per record.

  Args:
    state: a `SignatureState` with at least one update.

  Returns:
    A `Signature`.

  Raises:
    PeatError: if the state holds no record.
  """
  if int(state.steps) == 0:
    raise PeatError("signature_finalize: the state holds no record "
                    "(steps == 0); expected at least one signature_update. "
                    "Fix: update before finalizing.")
  with _x64_scope(state.row_abs_max.dtype):
    return _finalize_jit(state)
