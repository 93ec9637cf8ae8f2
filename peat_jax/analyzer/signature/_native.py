"""The native statistics pass: csrc/signature.cc through XLA FFI (CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.analyzer.signature._bits import _uint
from peat_jax.analyzer.signature._layout import flat
from peat_jax.analyzer.signature._pass import _shift_tests
from peat_jax.analyzer.signature._signature import (
    Array, NARROW_FORMATS, SignatureState, _DTYPE_CODE, _SUPPORTED, _bits_of)


# Float outputs of the native pass, in the order of csrc/signature.h.
_NATIVE_FLOATS = (
    "err_sum", "mag_err_sum", "rel_max", "rel_sum", "rel_sqs", "g_absmax",
    "g_sqs", "ratio_min", "ratio_max", "logratio_sum", "sx", "sy", "sxy",
    "sxx", "syy", "zeroed_g_max", "ref_t_max", "ref_t_sqs", "ref_g_max",
    "ref_g_sqs", "ref_t_rel_sum", "ref_g_rel_sum")
# Reference counts of the native pass, in the order of csrc/signature.h.
_NATIVE_REF_COUNTS = ("ref_n", "ref_t_closer", "ref_g_closer",
                      "ref_t_shrunk", "ref_t_grown", "ref_g_shrunk",
                      "ref_g_grown")


def cpu_only() -> bool:
  """Whether JAX runs on CPU alone (its default backend is the CPU: no
  accelerator was found or allowed), so that what is traced now runs on
  the CPU: the native kernels can be traced directly instead of as one
  branch of `lax.platform_dependent`, which traces every branch."""
  return jax.default_backend() == "cpu"


def _accumulate_native(t: Array, g: Array, ref_hi: Array | None,
                       ref_lo: Array | None, dims=None) -> SignatureState:
  """`_accumulate` on CPU: the full pass is the native kernel.

  `peat_jax/kernels/csrc/signature.cc` reads t and g (and the reference)
  once and returns every statistic but the shift tests (`_shift_tests`,
  a few thousand elements, in JAX); the sampled statistics
  (`_sampled_stats`) are taken from the same sample, on the same formulas. Same state as `_accumulate`: counts,
  histograms and hashes exactly, float sums up to summation order (the
  native sums run per lane in float32, combined in float64; sums of squares
  in float64); see tests/test_analyzer_native.py for the tolerances.

  Args:
    t: test record (any shape), or with ``dims`` flat and padded
      (:mod:`._layout`).
    g: golden record (same shape and dtype).
    ref_hi: optional float32 high part of the reference.
    ref_lo: optional float32 low part.
    dims: None (the record's own shape), or its :class:`~._layout.Dims`
      (R and C traced): its row and column fields then have
      ``dims.lines`` slots, its tiles at most ``cap / 64`` (zero beyond;
      :func:`._layout.trim`).

  Returns:
    The `SignatureState` of this record.
  """
  from peat_jax import kernels as _kernels  # pylint: disable=g-import-not-at-top

  dtype = t.dtype
  nbits = _bits_of(dtype)
  t, rows, cols, slots = flat(t, dims)
  g = g.reshape(-1)
  cap = t.shape[0]
  if dims is None:
    caps = dict(rows_cap=rows, cols_cap=cols,
                tiles_cap=(rows // 8) * (cols // 8))
    dims_arr = np.array([rows, cols], np.int32)
  else:
    caps = dict(rows_cap=slots, cols_cap=slots,
                tiles_cap=max(min(cap // 64, (slots // 8) ** 2), 1))
    dims_arr = jnp.stack([rows, cols]).astype(jnp.int32)
  has_ref = ref_hi is not None
  if has_ref:
    ref_hi = ref_hi.reshape(-1).astype(jnp.float32)
    ref_lo = ref_lo.reshape(-1).astype(jnp.float32)
  (ints, hashes, floats, row_ndiff, row_abs_max, row_abs_sum, row_abs_sqs,
   col_ndiff, col_abs_sum, tile_ndiff, hist_abs, hist_rel,
   sample_counts) = _kernels.signature_pass(t, g, ref_hi, ref_lo, dims_arr,
                                            **caps)
  if dims is None:
    tile_ndiff = tile_ndiff.reshape(rows // 8, cols // 8)
  nf = len(NARROW_FORMATS)
  sampled = dict(hist_abs=hist_abs, hist_rel=hist_rel,
                 pct_n=sample_counts[0], sample_n=sample_counts[1],
                 repr_t=sample_counts[2:2 + nf],
                 repr_g=sample_counts[2 + nf:2 + 2 * nf])
  k = _kernels.SIGNATURE_FLAG_SLOTS
  fl = {name: floats[i] for i, name in enumerate(_NATIVE_FLOATS)}
  refc = {name: ints[k + 3 * nbits + i]
          for i, name in enumerate(_NATIVE_REF_COUNTS)}
  ut = lax.bitcast_convert_type(t, _uint(dtype))
  ug = lax.bitcast_convert_type(g, _uint(dtype))
  shifts = _shift_tests(ut, ug, rows, cols)
  ref = {name: fl[name] for name in _NATIVE_FLOATS if name.startswith("ref")}
  ref.update(refc)
  ref["ref_steps"] = jnp.int32(1 if has_ref else 0)
  return SignatureState(
      steps=jnp.int32(1),
      dtype_code=jnp.int32(_DTYPE_CODE[_SUPPORTED[np.dtype(dtype)]]),
      n=jnp.asarray(rows * cols, jnp.int32), flags=ints[:k],
      bits_up=ints[k:k + nbits],
      bits_down=ints[k + nbits:k + 2 * nbits],
      ulp_cum=ints[k + 2 * nbits:k + 3 * nbits], row_ndiff=row_ndiff,
      row_abs_max=row_abs_max, row_abs_sum=row_abs_sum,
      row_abs_sqs=row_abs_sqs, col_ndiff=col_ndiff, col_abs_sum=col_abs_sum,
      tile_ndiff=tile_ndiff, err_sum=fl["err_sum"],
      mag_err_sum=fl["mag_err_sum"], rel_max=fl["rel_max"],
      rel_sum=fl["rel_sum"], rel_sqs=fl["rel_sqs"], g_absmax=fl["g_absmax"],
      g_sqs=fl["g_sqs"], ratio_min=fl["ratio_min"],
      ratio_max=fl["ratio_max"], logratio_sum=fl["logratio_sum"],
      slope_sums=jnp.stack([fl[x] for x in ("sx", "sy", "sxy", "sxx",
                                            "syy")]),
      hash_t=hashes[:2], hash_g=hashes[2:],
      shift_col_match=shifts[0], shift_col_n=shifts[1],
      shift_row_match=shifts[2], shift_row_n=shifts[3],
      transpose_match=shifts[4], transpose_n=shifts[5],
      zeroed_g_max=fl["zeroed_g_max"], **sampled, **ref)
