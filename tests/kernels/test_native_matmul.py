"""Native matmul KUT: every variant x dtype against a float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.kernels.checks import DTYPES, f64, gemm_rel_tol, matmul_ref, randn
from peat_jax.kernels.checks import rng_for
from peat_jax.kernels import native

VARIANTS = native.variants("matmul")
# Sizes not divisible by the tile (16), one divisible, and a batched case.
SHAPES = [((37, 50), (50, 45)), ((2, 19, 33), (2, 33, 21)),
          ((32, 64), (64, 48))]
TILE = 16


def _tol_ok(variant, a, b, out, dtype):
  k = a.shape[-1]
  scale = np.matmul(np.abs(f64(a)), np.abs(f64(b)))
  err = np.abs(f64(out) - matmul_ref(a, b))
  return err <= gemm_rel_tol(variant, k, dtype) * scale + 1e-30


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_matmul_matches_float64_reference(variant, dtype, shapes):
  rng = rng_for("mm", variant, dtype, shapes)
  a = randn(rng, shapes[0], dtype)
  b = randn(rng, shapes[1], dtype)
  out = jax.jit(lambda a, b: native.matmul(a, b, variant=variant,
                                           tile=TILE))(a, b)
  assert out.shape == a.shape[:-1] + b.shape[-1:] and out.dtype == a.dtype
  ok = _tol_ok(variant, a, b, out, dtype)
  n = b.shape[-1]
  if variant == "tile_edge_bug" and n % TILE:
    edge = (n // TILE) * TILE
    # Full tiles are right; the edge tile holds its left neighbour's values.
    assert ok[..., :edge].all()
    assert not ok[..., edge:].all()
    shifted = np.array(out, copy=True)
    shifted = f64(shifted)
    ref = matmul_ref(a, b)
    np.testing.assert_allclose(shifted[..., edge:], ref[..., edge - 1:n - 1],
                               rtol=5e-2, atol=5e-2)
  else:
    assert ok.all(), float((~ok).mean())


def _fma32(x, y, z):
  """float32 fused multiply-add x * y + z, one rounding (exact emulation).

  x * y is exact in float64; s = fl64(x * y + z) rounds to float32 like
  the exact sum unless s is a float32 midpoint, where the sign of the
  TwoSum error decides (ties to even only when the sum is exact).
  """
  p = x.astype(np.float64) * y.astype(np.float64)
  c = z.astype(np.float64)
  s = p + c
  bb = s - p
  err = (p - (s - bb)) + (c - bb)
  r = s.astype(np.float32)
  other = np.nextafter(r, np.where(s > r, np.inf, -np.inf).astype(np.float32))
  mid = (r.astype(np.float64) + other.astype(np.float64)) / 2
  tie = (s == mid) & (err != 0)
  up = np.maximum(r, other)
  down = np.minimum(r, other)
  return np.where(tie, np.where(err > 0, up, down), r).astype(np.float32)


def _k_ordered(a, b, fused):
  """C = A B with each element's K products added in increasing k order
  from +0 (what the blocked kernel promises), in float32."""
  c = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)
  for kk in range(a.shape[-1]):
    x = a[..., :, kk:kk + 1]
    y = b[..., kk:kk + 1, :]
    if fused:
      c = _fma32(np.broadcast_to(x, c.shape), np.broadcast_to(y, c.shape), c)
    else:
      c = c + x * y  # float32 arrays: one rounding per multiply and add
  return c


# Shapes around the blocked kernel's edges: k blocks of 128, row tiles of
# 120, column panels of 32 / 64 and column tiles of 256; and batches of
# products under 1 MFLOP, whose batch is shared among threads (80 items in
# 64 units; a small GPT's attention scores).
BLOCK_SHAPES = [(1, 1, 1), (7, 3, 5), (13, 300, 70), (130, 129, 300),
                (2, 121, 260, 33), (80, 24, 40, 30), (16, 64, 32, 64)]


@pytest.mark.parametrize("dims", BLOCK_SHAPES, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("variant", ["default", "fma", "in_bf16"])
def test_blocked_gemm_is_the_k_ordered_sum(variant, dims):
  """The blocked, threaded kernel equals the plain k-ordered sum bitwise,
  forward and both backward products, at every block edge."""
  *lead, m, k, n = dims
  rng = rng_for("mm-blocked", variant, dims)
  a = randn(rng, tuple(lead) + (m, k), "float32")
  b = randn(rng, tuple(lead) + (k, n), "float32")
  dc = randn(rng, tuple(lead) + (m, n), "float32")
  fused = variant == "fma"
  an, bn = np.asarray(a), np.asarray(b)
  if variant == "in_bf16":
    an = np.asarray(a.astype(jnp.bfloat16).astype(jnp.float32))
    bn = np.asarray(b.astype(jnp.bfloat16).astype(jnp.float32))
  f = lambda a, b: native.matmul(a, b, variant=variant)
  out, vjp = jax.vjp(f, a, b)
  np.testing.assert_array_equal(np.asarray(out), _k_ordered(an, bn, fused))
  da, db = vjp(dc)
  dcn = np.asarray(dc)
  if variant == "in_bf16":
    dcn = np.asarray(dc.astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(
      np.asarray(da), _k_ordered(dcn, np.swapaxes(bn, -1, -2), fused))
  np.testing.assert_array_equal(
      np.asarray(db), _k_ordered(np.swapaxes(an, -1, -2), dcn, fused))


@pytest.mark.parametrize("variant", [v for v in VARIANTS
                                     if v != "threaded_nondet"])
def test_shared_batch_equals_products_one_at_a_time(variant):
  """A batch of small products shared among threads gives every product
  bitwise as computed alone (batch 1, one thread), forward and backward."""
  rng = rng_for("mm-batch", variant)
  a = randn(rng, (72, 20, 36), "float32")
  b = randn(rng, (72, 36, 27), "float32")
  dc = randn(rng, (72, 20, 27), "float32")
  f = jax.jit(lambda a, b: native.matmul(a, b, variant=variant, tile=TILE))
  out, vjp = jax.vjp(f, a, b)
  da, db = vjp(dc)
  for i in (0, 1, 35, 70, 71):
    o1, vjp1 = jax.vjp(f, a[i:i + 1], b[i:i + 1])
    d1 = vjp1(dc[i:i + 1])
    np.testing.assert_array_equal(np.asarray(out[i:i + 1]), np.asarray(o1))
    np.testing.assert_array_equal(np.asarray(da[i:i + 1]), np.asarray(d1[0]))
    np.testing.assert_array_equal(np.asarray(db[i:i + 1]), np.asarray(d1[1]))


def test_fma_emulation_rounds_once():
  """_fma32 on cases where two roundings differ from one."""
  x = np.float32(1 + 2**-12)
  y = np.float32(1 + 2**-12)
  z = np.float32(-(1 + 2**-11))
  # x * y = 1 + 2^-11 + 2^-24 exactly: fma keeps 2^-24, mul+add loses it.
  assert _fma32(np.array([x]), np.array([y]), np.array([z]))[0] == np.float32(2**-24)
  assert np.float32(x * y) + z == 0
  # Sums that a first rounding to float64 puts exactly on a float32
  # midpoint: the exact sum lies above (below) it.
  cases = [
      # 1 + (2^-24 + 2^-60): just above the midpoint of 1 and 1 + 2^-23.
      (4097 * 2.0**-30, 16773121 * 2.0**-30, 1.0, 1 + 2**-23),
      # (1 + 2^-23) + (2^-24 - 2^-60): just below the midpoint 1 + 3 * 2^-24
      # that ties-to-even would send up to 1 + 2^-22.
      ((2**18 - 1) * 2.0**-30, (2**18 + 1) * 2.0**-30, 1 + 2**-23, 1 + 2**-23),
  ]
  for x, y, z, want in cases:
    x, y, z = np.float32(x), np.float32(y), np.float32(z)
    # Rounding the float64 sum to float32 (two roundings) gets it wrong.
    assert np.float32(float(x) * float(y) + float(z)) != np.float32(want)
    got = _fma32(np.array([x]), np.array([y]), np.array([z]))[0]
    assert got == np.float32(want)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "default"])
def test_matmul_variant_is_a_real_change(variant):
  """On float32, each variant differs from default where it should."""
  rng = rng_for("mm-real", variant)
  a, b = randn(rng, (24, 300), "float32"), randn(rng, (300, 40), "float32")
  base = np.asarray(native.matmul(a, b))
  out = np.asarray(native.matmul(a, b, variant=variant, tile=TILE))
  if variant == "ftz":  # no subnormals here: ftz must equal default
    np.testing.assert_array_equal(out, base)
  else:
    assert not np.array_equal(out, base)


def test_matmul_rtz_is_biased_toward_zero():
  rng = rng_for("mm-rtz")
  a, b = randn(rng, (40, 64), "bfloat16"), randn(rng, (64, 40), "bfloat16")
  ref = matmul_ref(a, b)
  rtz = f64(native.matmul(a, b, variant="rtz"))
  rne = f64(native.matmul(a, b))
  assert (np.abs(rtz) <= np.abs(ref)).mean() > 0.99
  assert 0.3 < (np.abs(rne) <= np.abs(ref)).mean() < 0.7


def test_matmul_ftz_flushes_subnormals_at_the_kernel():
  """XLA CPU flushes subnormals in its own arithmetic, but hands a custom
  call its operands untouched; the kernels compute with IEEE subnormals
  except the ftz variant, which flushes them."""
  rng = rng_for("mm-ftz")
  a_np = (rng.uniform(1, 2, (4, 8)) * 1e-39).astype(np.float32)
  b_np = rng.uniform(0.1, 0.2, (8, 4)).astype(np.float32)
  a, b = jnp.asarray(a_np), jnp.asarray(b_np)
  # Checked in numpy: jnp.abs(a).max() runs on XLA, which flushes (to 0).
  assert 0 < np.abs(np.asarray(a)).max() < np.finfo(np.float32).tiny
  if jax.default_backend() == "cpu":
    assert float(jnp.max(a)) == 0.0  # XLA CPU's own arithmetic flushes
  default = np.asarray(native.matmul(a, b))
  ftz = np.asarray(native.matmul(a, b, variant="ftz"))
  ref = matmul_ref(a, b)
  assert (default != 0).all()
  np.testing.assert_allclose(default, ref, rtol=1e-4, atol=2e-45 * 8)
  assert (ftz == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_matmul_bitwise_determinism(variant):
  rng = rng_for("mm-det", variant)
  a, b = randn(rng, (33, 200), "float32"), randn(rng, (200, 35), "float32")
  f = jax.jit(lambda a, b: native.matmul(a, b, variant=variant, tile=TILE))
  first = np.asarray(f(a, b)).tobytes()
  if variant in native.NONDETERMINISTIC:
    # Thread timing decides the order of the partial sums: repeat until two
    # calls differ (typically within a few hundred calls of ~0.5 ms).
    seen = {first}
    for _ in range(3000):
      seen.add(np.asarray(f(a, b)).tobytes())
      if len(seen) > 1:
        break
    assert len(seen) > 1, "threaded_nondet gave identical bits 3000 times"
  else:
    for _ in range(3):
      assert np.asarray(f(a, b)).tobytes() == first


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("batched", [False, True])
def test_matmul_gradients_match_golden(variant, batched):
  """jax.grad through the custom_vjp (backward target with the same variant)
  vs jax.grad of jnp.matmul, within the variant's GEMM bound."""
  rng = rng_for("mm-grad", variant, batched)
  lead = (3,) if batched else ()
  a = randn(rng, lead + (13, 20), "float32")
  b = randn(rng, lead + (20, 17), "float32")
  w = randn(rng, lead + (13, 17), "float32")
  loss_k = lambda a, b: jnp.sum(native.matmul(a, b, variant=variant) * w)
  loss_g = lambda a, b: jnp.sum(jnp.matmul(a, b) * w)
  gk = jax.jit(jax.grad(loss_k, argnums=(0, 1)))(a, b)
  gg = jax.grad(loss_g, argnums=(0, 1))(a, b)
  abs_a, abs_b, abs_w = np.abs(f64(a)), np.abs(f64(b)), np.abs(f64(w))
  scales = (abs_w @ np.swapaxes(abs_b, -1, -2),   # dA = dC B^T, inner N
            np.swapaxes(abs_a, -1, -2) @ abs_w)   # dB = A^T dC, inner M
  for got, want, scale, inner in zip(gk, gg, scales, (17, 13)):
    tol = 2 * gemm_rel_tol(variant, inner, "float32") + 2e-6
    assert (np.abs(f64(got) - f64(want)) <= tol * scale).all(), variant


def test_matmul_vmap_and_broadcast():
  rng = rng_for("mm-vmap")
  a, b = randn(rng, (4, 9, 11), "float32"), randn(rng, (11, 6), "float32")
  ref = matmul_ref(a, b)
  out_bcast = native.matmul(a, b)  # jnp.matmul-style batch broadcast
  out_vmap = jax.vmap(native.matmul, in_axes=(0, None))(a, b)
  out_vmap2 = jax.vmap(jax.vmap(native.matmul, in_axes=(0, None)),
                       in_axes=(None, 0))(a, jnp.stack([b, 2 * b]))
  np.testing.assert_allclose(out_bcast, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out_vmap, out_bcast)
  np.testing.assert_allclose(out_vmap2[1], 2 * ref, rtol=1e-5, atol=1e-5)
  # grad through vmap with an unbatched operand sums its cotangent.
  g = jax.grad(lambda b: jnp.sum(jax.vmap(native.matmul, (0, None))(a, b)))(b)
  gg = jax.grad(lambda b: jnp.sum(jnp.matmul(a, b)))(b)
  np.testing.assert_allclose(g, gg, rtol=1e-5, atol=1e-5)
