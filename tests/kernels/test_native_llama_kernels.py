"""The native Llama-style kernels: rms_norm, silu (SwiGLU) and rope.

Every kernel x variant x dtype (float32, bfloat16, float16) on fresh seeded
inputs against the float64 value of the variant's own formula
(``peat_jax.kernels.checks``), within a worst-case rounding bound for that
variant's arithmetic; the slips (rms_norm ``eps`` and ``layer_norm``, silu
``swapped``, rope ``interleaved``, ``theta_500k`` and ``offset``) stand off
the golden formula by what their model predicts (the fitted eps, base and
offset, the permutation). Bitwise determinism, the backward against
``jax.grad`` of the float64 formula, jit / vmap, the KUT specs, and bad
input (``PeatError`` before the call, the handler's error after).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax
from peat_jax.kernels import _ffi
from peat_jax.kernels import checks
from peat_jax.kernels import kut as K
from peat_jax.kernels import native
from peat_jax.kernels.checks import OUT_TINY, OUT_U, U32, f64, randn, rng_for

DTYPES = ("float32", "bfloat16", "float16")
U_BF16 = 2.0**-8
EPS = 1e-6
THETA = 10000.0
D_RMS = 80          # not a power of two: the pairwise tree is uneven
SHAPE_RMS = (2, 7, D_RMS)
SHAPE_SILU = (6, 37)
SHAPE_ROPE = (2, 7, 3, 16)

CASES = [(k, v, d) for k in ("rms_norm", "silu", "rope")
         for v in native.variants(k) for d in DTYPES]
SLIPS = {("rms_norm", "eps"), ("rms_norm", "layer_norm"),
         ("silu", "swapped"), ("rope", "interleaved"),
         ("rope", "theta_500k"), ("rope", "offset")}


def _ids(case):
  return "-".join(case)


# ----------------------------------------------------------------- inputs


def _inputs(kernel, dtype, key=(), gated=True):
  """Seeded operands of one kernel (never zeros), as the KUT takes them."""
  rng = rng_for("llama", kernel, dtype, *key)
  if kernel == "rms_norm":
    # eps: rows whose mean square (~1e-5) is of eps's order, where the
    # constant shows; others rows of mean 0.3 and spread 1.5.
    small = "eps" in key
    return (randn(rng, SHAPE_RMS, dtype, scale=3e-3 if small else 1.5,
                  shift=0.0 if small else 0.3),
            randn(rng, (D_RMS,), dtype, scale=0.5, shift=1.0))
  if kernel == "silu":
    x = randn(rng, SHAPE_SILU, dtype, scale=3.0)
    return (x, randn(rng, SHAPE_SILU, dtype)) if gated else (x,)
  x = randn(rng, SHAPE_ROPE, dtype)
  positions = jnp.asarray(rng.integers(0, 200, SHAPE_ROPE[1]), jnp.int32)
  return x, positions


def _call(kernel, variant, args):
  if kernel == "rms_norm":
    return native.rms_norm(*args, EPS, variant=variant)
  if kernel == "silu":
    return native.silu(*args, variant=variant)
  return native.rope(*args, theta=THETA, variant=variant)


def _kwargs(kernel):
  return {"rms_norm": {"eps": EPS}, "silu": {},
          "rope": {"theta": THETA}}[kernel]


def _reference(kernel, args, variant):
  return checks.llama_reference(kernel, *args, variant=variant,
                                **_kwargs(kernel))


# ------------------------------------------------------------- tolerances


def _rope_scales(x, positions, variant):
  """Per element: |xa| + |xb| of its rotated pair and |its angle|."""
  x = np.abs(f64(x))
  d = x.shape[-1]
  a = np.abs(checks.rope_angles(np.asarray(positions), d, THETA, variant))
  a = np.broadcast_to(a, x.shape[:-1] + (d // 2,))
  if variant == "interleaved":
    p = x[..., 0::2] + x[..., 1::2]
    return (np.repeat(p, 2, axis=-1), np.repeat(a, 2, axis=-1))
  p = x[..., :d // 2] + x[..., d // 2:]
  return np.concatenate([p, p], -1), np.concatenate([a, a], -1)


def _tolerance(kernel, variant, dtype, args, ref):
  """Elementwise worst-case bound on |t - ref| for the variant's arithmetic.

  Terms: the output rounding u_out |ref|; float32 work (a sum of D squares:
  D/2 u32 in rstd; silu's exp, add, divide, multiply; rope's products and
  the float32 angle, whose rounding moves the result by |x| |angle| u32);
  the variant's own roundings (hf: 3 in x's dtype; acc_bf16: D/2 u_bf16 in
  rstd; bf16 silu: each operation, and the input rounded to bf16 scaled by
  silu's condition number 1 + |x|; fast_exp: the cubic's 1.7e-4). A factor
  2 of margin, and u_out times the smallest normal for subnormal outputs.
  """
  u = OUT_U[dtype]
  r = np.abs(ref)
  tiny = u * OUT_TINY[dtype]
  if kernel == "rms_norm":
    x, s = f64(args[0]), f64(args[1])
    eps = checks.RMS_PORT_EPS if variant == "eps" else EPS
    mag, m = np.abs(x), 0.0
    if variant == "layer_norm":  # x - mean rounds at the scale of both
      m = x.mean(-1, keepdims=True)
      mag = mag + np.abs(m)
    rstd = 1 / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)
    a = mag * rstd * np.abs(s)
    work = (D_RMS / 2 + 6) * U32
    if variant == "acc_bf16":
      work = (D_RMS / 2 + 2) * U_BF16
    rounding = 3 * u if variant == "hf" else u
    return 2 * (rounding * np.maximum(r, a) + work * a) + tiny
  if kernel == "silu":
    x = f64(args[0])
    up = f64(args[1]) if len(args) > 1 else np.ones_like(x)
    arg = up if variant == "swapped" else x
    other = x if variant == "swapped" else up
    rel = u + 8 * U32
    if variant == "fast_exp":
      rel += 2e-4
    if variant == "bf16":
      rel += (6 + np.abs(arg)) * U_BF16
    tol = 2 * rel * r
    if variant == "tanh":
      tol = tol + 4 * U32 * np.abs(arg) * np.abs(other)
    return tol + tiny
  p, ang = _rope_scales(args[0], args[1], variant)
  work = (4 + 3 * ang) * U32
  if variant == "hf":
    work = 3 * u + (5 + 4 * ang) * U32
  return 2 * (u * r + p * work) + tiny


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward_within_its_bound_and_deterministic(case):
  """Each variant meets the bound of its own formula, twice bitwise; a slip
  stands off the golden formula by the difference of the two formulas (its
  error is what its model predicts, not noise)."""
  kernel, variant, dtype = case
  args = _inputs(kernel, dtype, ("fwd", variant))
  out = _call(kernel, variant, args)
  assert out.dtype == args[0].dtype and out.shape == args[0].shape
  again = _call(kernel, variant, args)
  np.testing.assert_array_equal(np.asarray(out).view(np.uint8),
                                np.asarray(again).view(np.uint8))
  t = f64(out)
  ref = _reference(kernel, args, variant)
  tol = _tolerance(kernel, variant, dtype, args, ref)
  err = np.abs(t - ref)
  assert np.all(np.isfinite(t))
  worst = np.unravel_index(np.argmax(err - tol), err.shape)
  assert np.all(err <= tol), (worst, t[worst], ref[worst], tol[worst])
  if (kernel, variant) in SLIPS:
    golden = _reference(kernel, args, "default")
    gap = np.abs(ref - golden)
    off = np.abs(t - golden)
    # It meets its own formula (above), so its error against the golden
    # formula is the two formulas' difference: far outside the bound, at
    # many elements.
    assert off.max() > 10 * tol.max(), (off.max(), tol.max())
    assert (gap > 4 * tol).mean() > 0.1, (gap > 4 * tol).mean()


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_without_up(dtype):
  for variant in native.variants("silu"):
    args = _inputs("silu", dtype, ("plain", variant), gated=False)
    out = native.silu(*args, variant=variant)
    ref = _reference("silu", args, variant)
    tol = _tolerance("silu", variant, dtype, args, ref)
    assert np.all(np.abs(f64(out) - ref) <= tol), variant
  # Without up, swapped has nothing to swap: it is default bit for bit.
  np.testing.assert_array_equal(
      np.asarray(native.silu(args[0], variant="swapped")),
      np.asarray(native.silu(args[0], variant="default")))


def _fit_eps(y, x, s):
  """eps from y = x * s / sqrt(ms + eps), per element of large |x s|."""
  x, s, y = f64(x), f64(s), f64(y)
  ms = (x ** 2).mean(-1, keepdims=True)
  xs = x * s
  keep = np.abs(xs) > 0.5 * np.abs(xs).max(-1, keepdims=True)
  fit = (xs / y) ** 2 - ms
  return float(np.median(np.broadcast_to(fit, x.shape)[keep]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_eps_is_fitted_at_the_ports_constant(dtype):
  """On rows whose mean square is near eps (|x| ~ 3e-3) the output gives
  eps back: the argument's 1e-6 for default, the port's 1e-5 for eps."""
  rng = rng_for("llama-eps", dtype)
  x = randn(rng, (16, 64), dtype, scale=3e-3)
  s = randn(rng, (64,), dtype, scale=0.2, shift=1.0)
  got = {v: _fit_eps(native.rms_norm(x, s, EPS, variant=v), x, s)
         for v in ("default", "eps")}
  ms = float((f64(x) ** 2).mean())
  slack = 8 * OUT_U[dtype] * (ms + checks.RMS_PORT_EPS)
  assert abs(got["default"] - EPS) < slack, got
  assert abs(got["eps"] - checks.RMS_PORT_EPS) < slack, got


def test_rms_norm_layer_norm_is_centred():
  """layer_norm's rows have mean ~0 (times scale 1) where rms_norm's keep
  the input's shift."""
  rng = rng_for("llama-ln")
  x = randn(rng, (8, 64), "float32", shift=2.0)
  ones = jnp.ones((64,), jnp.float32)
  ln = f64(native.rms_norm(x, ones, EPS, variant="layer_norm"))
  rms = f64(native.rms_norm(x, ones, EPS, variant="default"))
  assert np.abs(ln.mean(-1)).max() < 1e-5
  assert rms.mean(-1).min() > 0.5
  np.testing.assert_allclose((ln ** 2).mean(-1), 1.0, rtol=1e-4)


def test_rms_norm_acc_bf16_error_grows_with_d():
  """The bf16 running sum: error grows with the row length (stagnation of
  the sum), far above the float32 kernel's."""
  errs = {}
  for d in (16, 1024):
    rng = rng_for("llama-acc", d)
    x = randn(rng, (8, d), "float32")
    s = jnp.ones((d,), jnp.float32)
    ref = checks.llama_reference("rms_norm", x, s, variant="default", eps=EPS)
    for v in ("default", "acc_bf16"):
      errs[v, d] = np.abs(f64(native.rms_norm(x, s, EPS, variant=v))
                          - ref).max()
  assert errs["acc_bf16", 1024] > 4 * errs["acc_bf16", 16], errs
  assert errs["acc_bf16", 1024] > 100 * errs["default", 1024], errs


def test_rms_norm_hf_rounds_in_the_input_dtype():
  """hf: float32 inputs give the float32 result; bf16 inputs a result that
  differs from default's one rounding (several roundings in bf16), within
  three bf16 roundings; a float32 scale is rounded to bf16 first."""
  x, s = _inputs("rms_norm", "bfloat16", ("hf",))
  s32 = s.astype(jnp.float32) * (1 + 2.0**-12)  # not a bf16 value
  hf = f64(native.rms_norm(x, s32, EPS, variant="hf"))
  np.testing.assert_array_equal(
      hf, f64(native.rms_norm(x, s32.astype(jnp.bfloat16), EPS,
                              variant="hf")))
  dflt = f64(native.rms_norm(x, s32, EPS, variant="default"))
  assert (hf != dflt).mean() > 0.05
  ref = checks.llama_reference("rms_norm", x, s32, eps=EPS)
  tol = _tolerance("rms_norm", "hf", "bfloat16", (x, s32), ref)
  assert np.all(np.abs(hf - ref) <= tol)


def test_silu_closed_forms_in_float32():
  """float32: tanh stays at float32 accuracy, fast_exp's cubic shows
  (~1e-4 relative, >30x default's error), bf16 rounds at bf16's unit."""
  x, up = _inputs("silu", "float32", ("forms",))
  ref = checks.llama_reference("silu", x, up)
  # Relative to |silu(x) up| + |x up|: tanh's 1 + tanh(x/2) cancels for
  # x << 0, an error of u32 |x up| (float32 accuracy, absolute).
  scale = np.abs(ref) + np.abs(f64(x) * f64(up))
  rel = {v: (np.abs(f64(native.silu(x, up, variant=v)) - ref) / scale).max()
         for v in ("default", "tanh", "fast_exp", "bf16")}
  assert rel["default"] < 8 * U32 and rel["tanh"] < 64 * U32, rel
  assert 30 * rel["default"] < rel["fast_exp"] < 4e-4, rel
  assert U_BF16 / 4 < rel["bf16"], rel


def test_silu_swapped_is_silu_of_up_times_x():
  x, up = _inputs("silu", "float32", ("swap",))
  np.testing.assert_array_equal(
      np.asarray(native.silu(x, up, variant="swapped")),
      np.asarray(native.silu(up, x, variant="default")))


def _rope_err(out, x, positions, variant, **kw):
  return np.abs(f64(out) - checks.llama_reference(
      "rope", x, positions, variant=variant, **kw)).max()


def test_rope_offset_and_base_are_fitted():
  """The output gives its parameters back: offset the shift +1 among
  -2..2, theta_500k the base 5e5 among 1e4..1e6 (the argument says 1e4)."""
  x, pos = _inputs("rope", "float32", ("fit",))
  out = native.rope(x, pos, theta=THETA, variant="offset")
  shifts = {k: _rope_err(out, x, pos + k, "default", theta=THETA)
            for k in range(-2, 3)}
  assert min(shifts, key=shifts.get) == 1 and shifts[1] < 1e-4, shifts
  out = native.rope(x, pos, theta=THETA, variant="theta_500k")
  bases = {b: _rope_err(out, x, pos, "default", theta=b)
           for b in (1e4, 5e4, 1e5, 5e5, 1e6)}
  assert min(bases, key=bases.get) == 5e5 and bases[5e5] < 1e-4, bases


def test_rope_interleaved_is_the_halves_rotation_permuted():
  """GPT-J's layout is the golden rotation of a permuted head: with P the
  de-interleaving permutation, interleaved(x) = P^-1 rope(P x): golden
  values in other places (indexing)."""
  x, pos = _inputs("rope", "float32", ("perm",))
  d = x.shape[-1]
  perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
  inv = np.argsort(perm)
  out = native.rope(x, pos, theta=THETA, variant="interleaved")
  want = native.rope(x[..., perm], pos, theta=THETA)[..., inv]
  np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_rope_positions_per_sequence():
  """positions (B, T) rotates each sequence by its own row."""
  x, pos = _inputs("rope", "float32", ("rows",))
  rows = jnp.stack([pos, pos[::-1]])
  out = native.rope(x, rows, theta=THETA)
  for b in range(2):
    np.testing.assert_array_equal(
        np.asarray(out[b]), np.asarray(native.rope(x[b:b + 1], rows[b],
                                                   theta=THETA)[0]))


def test_rope_position_zero_is_identity():
  x, _ = _inputs("rope", "bfloat16", ("zero",))
  zeros = jnp.zeros((x.shape[1],), jnp.int32)
  for v in ("default", "hf", "interleaved", "theta_500k"):
    np.testing.assert_array_equal(
        np.asarray(native.rope(x, zeros, theta=THETA, variant=v)),
        np.asarray(x))


# --------------------------------------------------------------- backward


def _diff_args(kernel):
  return {"rms_norm": (0, 1), "silu": (0, 1), "rope": (0,)}[kernel]


def _grad_tolerance(kernel, variant, dtype, args):
  """Normwise bound on max |g - ref| / max |ref| of each gradient."""
  u = OUT_U[dtype]
  if kernel == "rms_norm":
    rows = int(np.prod(SHAPE_RMS[:-1]))
    if variant == "acc_bf16":
      # Sums of mixed-sign terms (g * xhat over D, dy * xhat over the rows)
      # in bf16: rounding errors of random sign, growing as the square
      # root of the length (the worst case, (D + rows) u, is vacuous).
      return 4 * u + 4 * np.sqrt(D_RMS + rows) * U_BF16
    return 4 * u + (6 * u if variant == "hf" else 0) + 2 * (D_RMS + rows) * U32
  if kernel == "silu":
    if variant == "bf16":
      return 32 * U_BF16
    return 4 * u + 64 * U32 + (4e-4 if variant == "fast_exp" else 0)
  _, ang = _rope_scales(args[0], args[1], variant)
  return 4 * u + (6 * u if variant == "hf" else 0) + (8 + 8 * ang.max()) * U32


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_backward_is_the_gradient_of_its_formula(case):
  """jax.grad through the custom_vjp equals the float64 gradient of the
  variant's own formula (a slip's too: eps, centring, swap, layout, base,
  offset), and is bitwise deterministic."""
  kernel, variant, dtype = case
  args = _inputs(kernel, dtype, ("bwd", variant))
  argnums = _diff_args(kernel)
  rng = rng_for("llama-ct", kernel, variant, dtype)
  ct = randn(rng, args[0].shape, dtype)
  fn = jax.jit(lambda *a: _call(kernel, variant, a))
  _, vjp = jax.vjp(lambda *d: fn(*[
      d[argnums.index(i)] if i in argnums else a
      for i, a in enumerate(args)]), *[args[i] for i in argnums])
  got = vjp(ct)
  again = vjp(ct)
  want = checks.llama_vjp_reference(kernel, args, ct, argnums,
                                    variant=variant, **_kwargs(kernel))
  tol = _grad_tolerance(kernel, variant, dtype, args)
  for i, g, g2, w in zip(argnums, got, again, want):
    assert g.dtype == args[i].dtype and g.shape == args[i].shape
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8),
                                  np.asarray(g2).view(np.uint8))
    err = np.abs(f64(g) - w).max() / np.abs(w).max()
    assert err <= tol, (i, err, tol)
  if (kernel, variant) in SLIPS:
    golden = checks.llama_vjp_reference(kernel, args, ct, argnums,
                                        variant="default", **_kwargs(kernel))
    gaps = [np.abs(f64(g) - w).max() / np.abs(w).max()
            for g, w in zip(got, golden)]
    assert max(gaps) > 10 * tol, gaps


def test_rms_norm_mixed_dtypes_backward():
  """bf16 x with a float32 scale (a bf16 model's parameter): dscale comes
  back in float32, both gradients match the float64 formula's."""
  x, s = _inputs("rms_norm", "bfloat16", ("mixed",))
  s = s.astype(jnp.float32) + 1e-3
  ct = randn(rng_for("mixed-ct"), x.shape, "bfloat16")
  for variant in ("default", "hf"):
    _, vjp = jax.vjp(lambda x, s: native.rms_norm(x, s, EPS, variant=variant),
                     x, s)
    dx, ds = vjp(ct)
    assert dx.dtype == jnp.bfloat16 and ds.dtype == jnp.float32
    want = checks.llama_vjp_reference("rms_norm", (x, s), ct, (0, 1), eps=EPS)
    for g, w, tol in ((dx, want[0], 12 * U_BF16), (ds, want[1], 4 * U_BF16)):
      assert np.abs(f64(g) - w).max() <= tol * np.abs(w).max(), variant


# ------------------------------------------------------------- jit / vmap


def test_vmap_matches_the_loop_bitwise():
  """vmap over x with unbatched scale / up / positions (broadcast_all gives
  them the batch dim; the handlers map rows), and vmap of grad."""
  x, s = _inputs("rms_norm", "bfloat16", ("vmap",))
  f = lambda x: native.rms_norm(x, s, EPS, variant="pairwise")
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(x)),
                                np.stack([np.asarray(f(r)) for r in x]))
  g = jax.grad(lambda x, s: jnp.sum(native.rms_norm(x, s, EPS) ** 2),
               argnums=(0, 1))
  gx, gs = jax.jit(jax.vmap(g, in_axes=(0, None)))(x, s)
  for i in range(x.shape[0]):
    lx, ls = g(x[i], s)
    np.testing.assert_array_equal(np.asarray(gx[i]), np.asarray(lx))
    np.testing.assert_array_equal(np.asarray(gs[i]), np.asarray(ls))

  x, up = _inputs("silu", "float16", ("vmap",))
  f = lambda x: native.silu(x, up[0], variant="tanh")
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(x)),
                                np.stack([np.asarray(f(r)) for r in x]))
  g = jax.vmap(jax.grad(lambda a, b: jnp.sum(native.silu(a, b)),
                        argnums=(0, 1)))(x, up)
  want = jax.grad(lambda a, b: jnp.sum(native.silu(a, b)), argnums=(0, 1))(
      x, up)
  for a, b in zip(g, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  x, pos = _inputs("rope", "float32", ("vmap",))
  xs = jnp.stack([x, 2 * x])  # a leading vmapped dim over (B, T, H, D)
  f = lambda x: native.rope(x, pos, theta=THETA, variant="offset")
  got = jax.jit(jax.vmap(f))(xs)
  for i in range(2):
    np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(f(xs[i])))
  gp = jax.vmap(lambda p: native.rope(x, p, theta=THETA))(
      jnp.stack([pos, pos + 3]))
  np.testing.assert_array_equal(np.asarray(gp[1]),
                                np.asarray(native.rope(x, pos + 3,
                                                       theta=THETA)))
  dx = jax.vmap(jax.grad(lambda x: jnp.sum(f(x) * x)))(xs)
  for i in range(2):
    np.testing.assert_array_equal(
        np.asarray(dx[i]), np.asarray(jax.grad(lambda x: jnp.sum(f(x) * x))(
            xs[i])))


# ------------------------------------------------------------------- specs


def test_specs_and_site_conventions():
  specs = K.known_specs()
  for kernel in ("rms_norm", "silu", "rope"):
    for v in native.variants(kernel):
      assert f"native:{kernel}:{v}" in specs
      s = K.parse_kut(f"native:{kernel}:{v}")
      assert (s.kernel, s.variant, s.site_kernel) == (kernel, v, kernel)
    with pytest.raises(peat_jax.PeatError, match="has no tile"):
      K.parse_kut(f"native:{kernel}:default@8")
  x, s = _inputs("rms_norm", "bfloat16", ("spec",))
  f = K.kut_callable("native:rms_norm:eps")
  np.testing.assert_array_equal(
      np.asarray(f(x, s, EPS)),
      np.asarray(native.rms_norm(x, s, EPS, variant="eps")))
  assert f(x, None, EPS).shape == x.shape  # nnx.RMSNorm(use_scale=False)
  x, up = _inputs("silu", "bfloat16", ("spec",))
  f = K.kut_callable("native:silu:swapped")
  np.testing.assert_array_equal(np.asarray(f(x, up)),
                                np.asarray(native.silu(up, x)))
  np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(native.silu(x)))
  x, pos = _inputs("rope", "bfloat16", ("spec",))
  f = K.kut_callable("native:rope:theta_500k")
  want = native.rope(x, pos, theta=THETA, variant="theta_500k")
  np.testing.assert_array_equal(np.asarray(f(x, pos, theta=THETA)),
                                np.asarray(want))
  np.testing.assert_array_equal(np.asarray(f(x, pos, THETA)),
                                np.asarray(want))
  sub, = K.resolve_kut("native:silu:bf16")
  assert (sub.kernel, sub.phase) == ("silu", "fwd")
  for kernel in ("rms_norm", "silu", "rope"):
    assert native.kut(kernel, "default").func is native.KERNELS[kernel]
    assert set(native.EXPECTED_ERROR_MODEL[kernel]) == set(
        native.variants(kernel))


# --------------------------------------------------------------- bad input

F32 = jnp.ones((4, 8), jnp.float32)
X4 = jnp.ones((2, 3, 2, 8), jnp.float32)
POS = jnp.arange(3, dtype=jnp.int32)


@pytest.mark.parametrize("call,match", [
    (lambda: native.rms_norm(F32, jnp.ones(8), EPS, variant="welford"),
     "unknown variant 'welford'"),
    (lambda: native.rms_norm(np.ones((4, 8)), jnp.ones(8), EPS),
     "x has dtype float64"),
    (lambda: native.rms_norm(F32, jnp.ones(8, jnp.int32), EPS),
     "scale has dtype int32"),
    (lambda: native.rms_norm(F32, jnp.ones(7), EPS), r"scale \(D,\)"),
    (lambda: native.rms_norm(jnp.float32(1), jnp.ones(1), EPS), "rank >= 1"),
    (lambda: native.rms_norm(F32, jnp.ones(8), "1e-6"), "eps must be"),
    (lambda: native.silu(F32, F32.astype(jnp.bfloat16)), "share one dtype"),
    (lambda: native.silu(F32, jnp.ones((4, 7))), "up must have x's shape"),
    (lambda: native.silu(F32.astype(jnp.int32)), "x has dtype int32"),
    (lambda: native.silu(F32, variant="gelu"), "unknown variant 'gelu'"),
    (lambda: native.rope(jnp.ones((2, 3, 2, 7)), POS), "must be even"),
    (lambda: native.rope(X4, jnp.arange(4, dtype=jnp.int32)),
     r"positions must be \(T,\)"),
    (lambda: native.rope(X4, POS.astype(jnp.float32)), "expected int32"),
    (lambda: native.rope(X4, [0, 1, 2]), "int32 array"),
    (lambda: native.rope(F32, POS), r"expected x \(B, T, H, D\)"),
    (lambda: native.rope(X4, POS, theta=-1.0), "theta must be positive"),
    (lambda: native.rope(X4, POS, variant="offset@2"), "unknown variant"),
    (lambda: native.rope(np.ones((2, 3, 2, 8)), POS), "x has dtype float64"),
])
def test_bad_input_raises_peat_error(call, match):
  with pytest.raises(peat_jax.PeatError, match=match):
    call()


def test_bad_input_raises_before_tracing_inside_jit():
  with pytest.raises(peat_jax.PeatError, match="must be even"):
    jax.jit(lambda x: native.rope(x, jnp.arange(3, dtype=jnp.int32)))(
        jnp.ones((1, 3, 1, 5)))


@pytest.mark.parametrize("call,match", [
    (lambda: _ffi.rms_norm_fwd(F32, jnp.ones(8), 99, EPS), "unknown variant"),
    (lambda: _ffi.rms_norm_fwd(F32, jnp.ones((3, 8)), 0, EPS),
     "scale rows must divide"),
    (lambda: _ffi.silu_fwd(F32, None, 27), "unknown variant code 27"),
    (lambda: _ffi.silu_bwd(F32, F32, jnp.ones((8, 4)), 0), "up must have"),
    (lambda: _ffi.rope_fwd(jnp.ones((1, 3, 1, 5)), POS, 0, THETA),
     "must be even"),
    (lambda: _ffi.rope_fwd(X4, jnp.arange(4, dtype=jnp.int32), 0, THETA),
     "positions must be"),
    (lambda: _ffi.rope_fwd(X4, POS, 0, -2.0), "theta must be positive"),
    (lambda: _ffi.rope_fwd(X4, POS, 23, THETA), "unknown variant code 23"),
])
def test_handlers_reject_bad_calls(call, match):
  """Handler-side checks (run time): a direct FFI call that bypasses the
  Python checks fails with the handler's message, not a crash."""
  with pytest.raises(Exception, match=match):
    jax.block_until_ready(call())
