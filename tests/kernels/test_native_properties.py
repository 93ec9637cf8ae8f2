"""Each variant's defining property, on whatever platform jax computes on.

The float64 tests bound each variant's error; these check what makes a
variant the error model it stands for: an input-rounding variant is the
default kernel on rounded inputs (bit for bit, forward and backward), a
narrow accumulator's error grows with the reduction length far past the
float32 bound. (Nondeterminism, truncation's bias, FTZ and the edge-tile
bug are checked in test_native_matmul.py and test_native_softmax_layernorm.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.kernels import native
from peat_jax.kernels.checks import f64, matmul_ref, randn, rng_for


def _round_tf32(x: np.ndarray) -> np.ndarray:
  """float32 -> nearest tf32 (10 mantissa bits, ties to even), as float32."""
  u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  lsb = (u >> 13) & 1
  u = ((u + 0xFFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32)
  return u.view(np.float32)


ROUND = {
    "in_tf32": _round_tf32,
    "in_bf16": lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16)
                                    .astype(jnp.float32)),
    "in_fp16": lambda x: np.asarray(x, np.float32).astype(np.float16)
                         .astype(np.float32),
}


def test_tf32_rounding_helper():
  one = np.float32(1.0)
  ulp = np.float32(2.0**-10)
  x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20,
                -(1 + 2.0**-12)], np.float32)
  want = np.array([one, one + 2 * ulp, one + ulp, -one], np.float32)
  np.testing.assert_array_equal(_round_tf32(x), want)


def _call(kernel, variant, args):
  if kernel == "matmul":
    return native.matmul(*args, variant=variant)
  if kernel == "conv2d":
    return native.conv2d(*args, (1, 1), "SAME", variant=variant)
  if kernel == "softmax":
    return native.softmax(*args, variant=variant)
  return native.layer_norm(*args, 1e-5, variant=variant)


def _operands(kernel, rng):
  if kernel == "matmul":
    return [randn(rng, (2, 23, 300), "float32"),
            randn(rng, (2, 300, 19), "float32")]
  if kernel == "conv2d":
    return [randn(rng, (2, 7, 6, 5), "float32"),
            randn(rng, (3, 3, 5, 11), "float32")]
  if kernel == "softmax":
    return [randn(rng, (9, 70), "float32", scale=3.0)]
  return [randn(rng, (9, 70), "float32", scale=2.0, shift=0.5),
          randn(rng, (70,), "float32", shift=1.0),
          randn(rng, (70,), "float32", scale=0.5)]


CASES = [(k, v) for k in ("matmul", "conv2d") for v in ROUND] + [
    ("softmax", "in_bf16"), ("layer_norm", "in_bf16")]


@pytest.mark.parametrize("kernel,variant", CASES, ids="-".join)
def test_input_rounding_is_the_default_kernel_on_rounded_inputs(kernel,
                                                                variant):
  """`in_<fmt>` equals `default` applied to operands rounded to <fmt>, bit
  for bit (forward, and for the GEMMs the backward too, whose cotangent is
  rounded as well), and differs from `default` on the raw operands."""
  assert native.variants(kernel).count(variant) == 1
  rng = rng_for("rounded-inputs", kernel, variant)
  args = _operands(kernel, rng)
  rounded = [jnp.asarray(ROUND[variant](x)) for x in args]
  fv = jax.jit(lambda *xs: _call(kernel, variant, xs))
  fd = jax.jit(lambda *xs: _call(kernel, "default", xs))
  out, vjp = jax.vjp(fv, *args)
  want, vjp_d = jax.vjp(fd, *rounded)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
  assert not np.array_equal(np.asarray(out), np.asarray(fd(*args)))
  if kernel in ("matmul", "conv2d"):
    ct = randn(rng, out.shape, "float32")
    for got, exp in zip(vjp(ct), vjp_d(jnp.asarray(ROUND[variant](ct)))):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))


@pytest.mark.parametrize("variant,fmt_u", [("acc_bf16", 2.0**-8),
                                           ("acc_fp16", 2.0**-11)])
def test_narrow_accumulation_error_grows_with_k(variant, fmt_u):
  """A running sum rounded to <fmt> after each add: the error relative to
  sum |a||b| grows with K (at least 4x from K=32 to K=2048), stays within
  the K * u(<fmt>) bound, and at K=2048 is over 100x the float32 kernel's."""
  rel = {}
  for k in (32, 2048):
    rng = rng_for("acc-growth", variant, k)
    # Positive products: the running sum grows with k, and so does the
    # spacing of the narrow format at the sum.
    a = jnp.abs(randn(rng, (8, k), "float32")) + 0.1
    b = jnp.abs(randn(rng, (k, 8), "float32")) + 0.1
    scale = np.abs(f64(a)) @ np.abs(f64(b))
    ref = matmul_ref(a, b)
    rel[k] = {v: (np.abs(f64(native.matmul(a, b, variant=v)) - ref)
                  / scale).max() for v in (variant, "default")}
    assert rel[k][variant] <= 2 * k * fmt_u, (k, rel[k])
  assert rel[2048][variant] > 4 * rel[32][variant], rel
  assert rel[2048][variant] > 100 * rel[2048]["default"], rel
