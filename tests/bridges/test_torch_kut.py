"""torch kernels as JAX ops and KUTs: zero copy, forward/backward, errors."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import peat_jax as peat
from peat_jax import bridges
from peat_jax.bridges import _torch
from peat_jax.bridges import torch_kut as tk
from peat_jax.models import layers

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _rand(seed, shape, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# ------------------------------------------------------------ zero copy


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_eager_dlpack_is_zero_copy(dtype):
  x = _rand(1, (8, 16), dtype)
  t = bridges.to_torch(x)
  assert t.data_ptr() == x.unsafe_buffer_pointer()
  assert str(t.dtype) == f"torch.{jnp.dtype(dtype).name}"
  back = bridges.from_torch(t)
  assert back.unsafe_buffer_pointer() == t.data_ptr()
  np.testing.assert_array_equal(np.asarray(back.astype(jnp.float32)),
                                np.asarray(x.astype(jnp.float32)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_callback_inputs_and_output_are_xla_buffers(dtype):
  """Inside jit torch sees XLA's own input buffer and writes its output."""
  seen = {}

  def spy(a, b, out):
    seen["in"] = (a.data_ptr(), b.data_ptr())
    seen["out"] = out.data_ptr()
    return torch.add(a, b, out=out)

  x, y = _rand(2, (32, 8), dtype), _rand(3, (32, 8), dtype)
  op = bridges.torch_op(spy, out_arg=True, result_shape=lambda a, b:
                        jax.ShapeDtypeStruct(a.shape, a.dtype))
  z = jax.jit(op)(x, y)
  assert seen["in"] == (x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer())
  assert seen["out"] == z.unsafe_buffer_pointer()
  np.testing.assert_array_equal(np.asarray(z), np.asarray(x + y))


def test_inplace_write_to_input_raises():
  def bad(a):
    return a.mul_(2)

  with pytest.raises(Exception, match="wrote to its input 0 in place"):
    jax.block_until_ready(jax.jit(bridges.torch_op(bad))(_rand(4, (4, 4))))


# --------------------------------------------------- forward / backward


def _dg(a, b, **kw):
  return lax.dot_general(a, b, (((2,), (0,)), ((), ())), **kw)


def _conv_params(x, w, strides, padding):
  jaxpr = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
      x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")))(
          x, w)
  eqn = next(e for e in jaxpr.eqns if e.primitive.name ==
             "conv_general_dilated")
  return dict(eqn.params)


def _cases():
  x3, w2 = _rand(10, (3, 5, 7)), _rand(11, (7, 4))
  dg = tk.dot_general_kut(torch.matmul)
  dn = (((2,), (0,)), ((), ()))
  img, fil = _rand(12, (2, 7, 6, 3)), _rand(13, (3, 3, 3, 4))
  cp = _conv_params(img, fil, (2, 1), ((0, 1), (1, 0)))
  conv = tk.conv_kut(F.conv2d)
  h, s, b = _rand(14, (2, 5, 16)), _rand(15, (16,)), _rand(16, (16,))
  q, k, v = _rand(17, (2, 6, 2, 4)), _rand(18, (2, 6, 2, 4)), _rand(
      19, (2, 6, 2, 4))
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  lg = _rand(20, (6, 10))
  lb = jnp.asarray(np.random.default_rng(21).integers(0, 10, 6), jnp.int32)
  return {
      "dot_general": (lambda a, c: dg(a, c, dimension_numbers=dn,
                                       precision=None,
                                       preferred_element_type=jnp.float32),
                      lambda a, c: lax.dot_general(a, c, dn), (x3, w2)),
      "conv": (lambda a, c: conv(a, c, **cp),
               lambda a, c: lax.conv_general_dilated(a, c, **cp), (img, fil)),
      "softmax": (tk.composite_kut("softmax", torch.softmax), layers.softmax,
                  (h,)),
      "layer_norm": (tk.composite_kut("layer_norm", F.layer_norm),
                     layers.layer_norm, (h, s, b)),
      "gelu": (tk.composite_kut("gelu", F.gelu), layers.gelu, (h,)),
      "attention": (lambda *a: tk.composite_kut(
          "attention", F.scaled_dot_product_attention)(*a, mask),
                    lambda *a: layers.attention(*a, mask), (q, k, v)),
      "cross_entropy": (lambda a: tk.composite_kut(
          "cross_entropy", F.cross_entropy)(a, lb),
                        lambda a: layers.cross_entropy(a, lb), (lg,)),
  }


@pytest.mark.parametrize("kind", list(_cases()))
def test_forward_and_backward_match_golden(kind):
  kut, gold, args = _cases()[kind]
  probe = _rand(30, jax.eval_shape(gold, *args).shape)

  def value_and_grads(f):
    loss = lambda *a: jnp.sum(f(*a) * probe)
    return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))

  vk, gk = value_and_grads(kut)(*args)
  vg, gg = value_and_grads(gold)(*args)
  np.testing.assert_allclose(float(vk), float(vg), rtol=1e-5, atol=1e-5)
  for a, b in zip(gk, gg):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16],
                         ids=lambda d: jnp.dtype(d).name)
def test_half_precision_runs_in_that_dtype(dtype):
  a, b = _rand(40, (16, 32), dtype), _rand(41, (32, 8), dtype)
  out = jax.jit(bridges.torch_op(torch.matmul))(a, b)
  assert out.dtype == jnp.dtype(dtype)
  ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=0.05,
                             atol=0.1)


def test_vmap_and_repeat_calls_are_deterministic():
  op = bridges.torch_op(lambda t: torch.softmax(t, dim=-1))
  x = _rand(50, (3, 4, 9))
  f = jax.jit(jax.vmap(op))
  y1, y2 = f(x), f(x)
  np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))
  np.testing.assert_allclose(np.asarray(y1), np.asarray(jax.nn.softmax(x)),
                             rtol=1e-6, atol=1e-7)


def test_torch_library_custom_op_with_fake_and_autograd():
  @torch.library.custom_op("peat_test::scaled_tanh", mutates_args=())
  def scaled_tanh(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.tanh(x) * s

  @scaled_tanh.register_fake
  def _(x, s):
    del s
    return torch.empty_like(x)

  def setup(ctx, inputs, output):
    del output
    ctx.save_for_backward(inputs[0])
    ctx.s = inputs[1]

  def backward(ctx, g):
    x, = ctx.saved_tensors
    return g * ctx.s * (1 - torch.tanh(x) ** 2), None

  scaled_tanh.register_autograd(backward, setup_context=setup)
  op = bridges.torch_op(lambda t: scaled_tanh(t, 2.0))
  x = _rand(55, (3, 4))
  np.testing.assert_allclose(np.asarray(jax.jit(op)(x)),
                             np.asarray(2 * jnp.tanh(x)), rtol=1e-6)
  g = jax.jit(jax.grad(lambda x: op(x).sum()))(x)
  np.testing.assert_allclose(np.asarray(g),
                             np.asarray(2 * (1 - jnp.tanh(x) ** 2)),
                             rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- errors


def test_mixed_dtypes_are_refused_not_cast():
  a, b = _rand(60, (4, 4)), _rand(61, (4, 4), jnp.bfloat16)
  with pytest.raises(peat.PeatError, match="share one dtype"):
    bridges.torch_op(torch.matmul)(a, b)
  dg = tk.dot_general_kut(torch.matmul)
  with pytest.raises(peat.PeatError, match="never casts"):
    dg(a, b, dimension_numbers=(((1,), (0,)), ((), ())))


def test_result_shape_that_cannot_be_inferred_names_the_fix():
  def no_meta(t):
    return torch.from_numpy(t.numpy() + 1)  # meta tensors have no data

  with pytest.raises(peat.PeatError, match="result_shape="):
    bridges.torch_op(no_meta)(_rand(62, (3,)))


def test_wrong_result_shape_raises_at_run_time():
  op = bridges.torch_op(lambda t: t.sum(0), result_shape=lambda a:
                        jax.ShapeDtypeStruct(a.shape, a.dtype))
  with pytest.raises(Exception, match="expected torch.float32"):
    jax.block_until_ready(jax.jit(op)(_rand(63, (3, 2))))


def test_missing_torch_gives_install_hint(monkeypatch):
  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(bridges.TorchNotInstalledError,
                     match=r"pip install 'peat_jax\[torch\]'"):
    _torch.require_torch()
  with pytest.raises(ImportError):  # also an ImportError for callers
    _torch.require_torch()


def test_importing_peat_jax_and_bridges_does_not_import_torch():
  code = ("import sys, peat_jax, peat_jax.models, peat_jax.bridges as b; "
          "import peat_jax as p; p.resolve_kut('torch:matmul'); "
          "print('torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True)
  assert out.stdout.strip() == "False"


# ------------------------------------------------------------- registry


def test_builtin_specs_resolve_to_site_kernels():
  want = {"torch:matmul": "dot_general", "torch:conv2d":
          "conv_general_dilated", "torch:softmax": "softmax",
          "torch:layer_norm": "layer_norm", "torch:gelu": "gelu",
          "torch:attention": "attention",
          "torch:cross_entropy": "cross_entropy"}
  for spec, kernel in want.items():
    sub, = peat.resolve_kut(spec)
    assert sub.kernel == kernel and sub.phase == "fwd"
    assert spec in bridges.registered()


def test_register_torch_kut_and_bad_names():
  spec = bridges.register_torch_kut("test_double_softmax",
                                    lambda x, dim: torch.softmax(2 * x, dim),
                                    kernel="softmax")
  assert spec == "torch:test_double_softmax"
  sub, = peat.resolve_kut(spec)
  x = _rand(70, (2, 5))
  np.testing.assert_allclose(np.asarray(sub.kut(x)),
                             np.asarray(jax.nn.softmax(2 * x)), rtol=1e-6)
  with pytest.raises(peat.PeatError, match="without ':' or '@'"):
    bridges.register_torch_kut("a:b", torch.matmul, kernel="dot_general")
  with pytest.raises(peat.PeatError, match="no torch adapter"):
    bridges.register_torch_kut("x", torch.matmul, kernel="reduce_max")


def test_unregistered_torch_spec_says_how_to_register():
  with pytest.raises(peat.PeatError, match="peat_jax.bridges"):
    peat.resolve_kut("torch:no_such_kernel")


def test_torch_kut_at_sites_of_a_jax_function():
  """peat.substitute / peat.tap run the torch KUT inside the compiled fn."""
  w1, w2 = _rand(80, (6, 12)), _rand(81, (12, 3))
  x = _rand(82, (5, 6))

  def loss(w1, w2, x):
    return jnp.sum(layers.gelu(x @ w1) @ w2)

  subs = peat.resolve_kut("torch:matmul")
  f = jax.jit(peat.substitute(loss, *subs))
  np.testing.assert_allclose(float(f(w1, w2, x)), float(loss(w1, w2, x)),
                             rtol=1e-5)
  _, taps = jax.jit(peat.tap(loss, peat.Substitution(
      subs[0].kut, kernel="dot_general", phase="fwd")))(w1, w2, x)
  assert len(taps) == 2
  for t in taps.values():
    np.testing.assert_allclose(np.asarray(t.kut), np.asarray(t.golden),
                               rtol=1e-5, atol=1e-6)
