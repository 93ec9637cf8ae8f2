"""The user's own KUT specs: py:, ffi: (compiled here from source), torch:.

The FFI libraries are docs/examples/ffi_matmul.cc and ffi_kernels.cc,
compiled by this test with g++ against jax.ffi.include_dir(), outside
peat_jax's own kernel registry; every calling convention of docs/kernels.md
is validated through ffi: against the golden kernel and float64, forward
and backward.
"""

import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

import peat_jax as peat
from peat_jax import kernels
from peat_jax.kernels import _ffi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "docs", "examples")


def _compile(source: str, out: str) -> str:
  if _ffi.jax_platform() != "cpu":
    pytest.skip(f"g++ builds CPU handlers; jax computes on "
                f"{_ffi.jax_platform()}, where load_user_library refuses "
                "them (test_user_platform.py)")
  gxx = shutil.which("g++")
  if gxx is None:
    pytest.skip("g++ is not installed: cannot build the example FFI library")
  subprocess.run([gxx, "-std=c++17", "-O2", "-fPIC", "-shared",
                  f"-isystem{jax.ffi.include_dir()}",
                  os.path.join(EXAMPLES, source), "-o", out], check=True)
  return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
  """(matmul library, library of the other conventions), built from source."""
  d = tmp_path_factory.mktemp("ffi")
  return (_compile("ffi_matmul.cc", str(d / "libffi_matmul.so")),
          _compile("ffi_kernels.cc", str(d / "libffi_kernels.so")))


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
  """A module of the user's own py: KUTs, importable from the cwd."""
  (tmp_path / "my_kernels.py").write_text(textwrap.dedent("""
      import jax
      import jax.numpy as jnp

      def layer_norm(x, scale, bias, eps):
        m = jnp.mean(x, -1, keepdims=True)
        v = jnp.mean(jnp.square(x - m), -1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + eps) * scale + bias

      def wrong_signature(x, weight):
        return x

      def wrong_shape(x, scale, bias, eps):
        return x[..., :1]

      def raises(x, scale, bias, eps):
        raise RuntimeError("my kernel is broken")
      """))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))
  yield "my_kernels"
  sys.modules.pop("my_kernels", None)


def _rand(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape), jnp.float32)


# ------------------------------------------------------------- parsing


@pytest.mark.parametrize("spec, kernel, message", [
    ("py:json:dumps", None, "needs the site kernel it replaces"),
    ("py:no_such_module_xyz:f", "softmax", "cannot be imported: not found"),
    ("py:json:no_such_fn", "softmax", "has no function 'no_such_fn'"),
    ("py:json", "softmax", "expected py:<module>:<function>"),
    ("ffi:/no/such/lib.so:F", "softmax", "library '/no/such/lib.so' not found"),
    ("torch:json:dumps", "exp", "no torch adapter for site kernel 'exp'"),
    ("py:json:dumps@softmax", "gelu", "names site kernel 'softmax'"),
    ("native:matmul:default", "softmax", "replaces 'dot_general' sites"),
])
def test_bad_specs_name_the_problem(spec, kernel, message):
  with pytest.raises(peat.PeatError, match=message):
    kernels.parse_kut(spec, kernel=kernel)


def test_a_missing_symbol_is_named(libs):
  with pytest.raises(peat.PeatError, match="has no symbol 'NoSuchHandler'"):
    kernels.parse_kut(f"ffi:{libs[0]}:NoSuchHandler", kernel="dot_general")


def test_user_specs_carry_their_kernel_and_pickle(libs, user_module):
  py = kernels.parse_kut(f"py:{user_module}:layer_norm", kernel="layer_norm")
  assert py.spec == "py:my_kernels:layer_norm@layer_norm"
  assert (py.source, py.site_kernel, py.parts) == (
      "py", "layer_norm", ("my_kernels", "layer_norm"))
  assert kernels.parse_kut(py.spec) == py       # the key parses back
  ffi = kernels.parse_kut(f"ffi:{libs[0]}:MyMatmul:MyMatmulBwd",
                          kernel="dot_general")
  assert ffi.parts == (libs[0], "MyMatmul", "MyMatmulBwd")
  assert pickle.loads(pickle.dumps(ffi)) == ffi  # isolated workers get it
  golden = kernels.parse_kut("golden", kernel="softmax")
  assert golden.spec == "golden@softmax" and golden.site_kernel == "softmax"


# ------------------------------------------------------------- py: KUTs


def _ln_step(x, ln_params, graphdef):
  def loss(p, x):
    return jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x)))
  return jax.grad(loss, argnums=(0, 1))(ln_params, x)


def test_py_kut_runs_at_a_recognized_site(user_module):
  graphdef, params = nnx.split(nnx.LayerNorm(16, rngs=nnx.Rngs(0)))
  x = _rand(np.random.default_rng(1), 4, 16)
  step = lambda p, x: _ln_step(x, p, graphdef)  # noqa: E731
  subs = peat.resolve_kut(f"py:{user_module}:layer_norm", kernel="layer_norm",
                          backward="kut")
  got = jax.jit(peat.substitute(step, *subs))(params, x)
  want = jax.jit(step)(params, x)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("fn, message", [
    ("wrong_signature", r"cannot take the arguments of a layer_norm site.*"
     r"kut\(x, scale, bias, eps\)"),
    ("wrong_shape", r"returned float32\[4, 1\]; expected float32\[4, 16\]"),
    ("raises", "raised RuntimeError: my kernel is broken"),
])
def test_py_kut_errors_at_the_first_call_name_the_site(user_module, fn,
                                                       message):
  graphdef, params = nnx.split(nnx.LayerNorm(16, rngs=nnx.Rngs(0)))
  x = _rand(np.random.default_rng(1), 4, 16)
  step = lambda p, x: _ln_step(x, p, graphdef)  # noqa: E731
  subs = peat.resolve_kut(f"py:{user_module}:{fn}", kernel="layer_norm")
  with pytest.raises(peat.PeatError, match=message) as err:
    jax.jit(peat.substitute(step, *subs))(params, x)
  assert "fwd/LayerNorm/layer_norm:0" in str(err.value)


# ------------------------------------------------------------ ffi: KUTs


def _composite_cases(rng):
  """kernel -> (symbol, f(*args), args) at recognized composite sites."""
  x = _rand(rng, 4, 6, 16)
  ln = nnx.LayerNorm(16, rngs=nnx.Rngs(0))
  rms = nnx.RMSNorm(16, rngs=nnx.Rngs(1))
  q, k, v = _rand(rng, 2, 5, 2, 8), _rand(rng, 2, 7, 2, 8), _rand(rng, 2, 7,
                                                                 2, 8)
  mask = jnp.asarray(rng.random((2, 1, 5, 7)) > 0.3)
  labels = jnp.asarray(rng.integers(0, 16, (4, 6)), jnp.int32)
  return {
      "softmax": ("MySoftmax", lambda x: jax.nn.softmax(x, axis=1), (x,)),
      "log_softmax": ("MyLogSoftmax", lambda x: jax.nn.log_softmax(x), (x,)),
      "layer_norm": ("MyLayerNorm", ln, (x,)),
      "rms_norm": ("MyRmsNorm", rms, (x,)),
      "gelu": ("MyGelu", lambda x: jax.nn.gelu(x), (x,)),
      "gelu_erf": ("MyGelu", lambda x: jax.nn.gelu(x, approximate=False),
                   (x,)),
      "attention": ("MyAttention", lambda q, k, v: jax.nn.dot_product_attention(
          q, k, v, mask=mask), (q, k, v)),
      "attention_causal": ("MyAttention", lambda q, k, v:
                           jax.nn.dot_product_attention(
                               q, k[:, :5], v[:, :5], is_causal=True),
                           (q, k, v)),
      "cross_entropy": ("MyCrossEntropy", lambda x:
                        optax.softmax_cross_entropy_with_integer_labels(
                            x, labels), (x,)),
  }


@pytest.mark.parametrize("case", ["softmax", "log_softmax", "layer_norm",
                                  "rms_norm", "gelu", "gelu_erf", "attention",
                                  "attention_causal", "cross_entropy"])
def test_ffi_conventions_forward_and_backward(libs, case):
  """Each composite convention: KUT and golden agree to float32 rounding."""
  symbol, f, args = _composite_cases(np.random.default_rng(7))[case]
  kernel = case.replace("_causal", "").replace("gelu_erf", "gelu")
  spec = kernels.parse_kut(f"ffi:{libs[1]}:{symbol}:{symbol}Bwd",
                           kernel=kernel)
  loss = lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
  step = lambda *a: (f(*a), jax.grad(loss, argnums=range(len(a)))(*a))  # noqa: E731
  sites = peat.discover_sites(step, *args)
  assert {s.phase for s in sites if s.kernel == kernel} == {"fwd", "bwd"}
  golden = jax.jit(step)(*args)
  got = jax.jit(peat.substitute(step, *peat.resolve_kut(spec,
                                                        backward="kut")))(*args)
  with jax.enable_x64(True):  # float64 of the same step
    ref = step(*[np.asarray(a, np.float64) for a in args])
  for g, k, r in zip(jax.tree.leaves(golden), jax.tree.leaves(got),
                     jax.tree.leaves(ref)):
    g, k, r = (np.asarray(a, np.float64) for a in (g, k, r))
    scale = np.max(np.abs(r)) + 1e-30
    assert not np.array_equal(k, np.zeros_like(k))
    # The KUT is as close to float64 as golden is, within a few ulps.
    assert np.max(np.abs(k - r)) <= 8 * np.max(np.abs(g - r)) + 4e-7 * scale


def test_ffi_dot_general_and_conv_with_their_backward(libs):
  rng = np.random.default_rng(3)
  mm = kernels.kut.kut_callable(kernels.parse_kut(
      f"ffi:{libs[0]}:MyMatmul:MyMatmulBwd", kernel="dot_general"))
  conv = kernels.kut.kut_callable(kernels.parse_kut(
      f"ffi:{libs[1]}:MyConv2d:MyConv2dBwd", kernel="conv_general_dilated"))
  a, b = _rand(rng, 3, 5, 7), _rand(rng, 7, 4)
  x, w = _rand(rng, 2, 9, 8, 3), _rand(rng, 3, 2, 3, 5)
  dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
  cparams = dict(window_strides=(2, 1), padding=((1, 0), (1, 1)),
                 lhs_dilation=(1, 1), rhs_dilation=(1, 1),
                 dimension_numbers=dn, feature_group_count=1,
                 batch_group_count=1)
  cases = [
      (lambda a, b: mm(a, b, dimension_numbers=(((2,), (0,)), ((), ()))),
       lambda a, b: jnp.einsum("bmk,kn->bmn", a, b), (a, b)),
      (lambda x, w: conv(x, w, **cparams),
       lambda x, w: lax.conv_general_dilated(x, w, **cparams), (x, w))]
  for kut, golden, args in cases:
    loss = lambda f: lambda *z: jnp.sum(jnp.sin(f(*z)))  # noqa: E731
    np.testing.assert_allclose(kut(*args), golden(*args), rtol=1e-5,
                               atol=1e-5)
    for gk, gg in zip(jax.grad(loss(kut), argnums=(0, 1))(*args),
                      jax.grad(loss(golden), argnums=(0, 1))(*args)):
      np.testing.assert_allclose(gk, gg, rtol=1e-5, atol=1e-5)


def test_ffi_handler_errors_name_the_site_and_the_convention(libs):
  rng = np.random.default_rng(5)
  a, b = _rand(rng, 4, 8), _rand(rng, 8, 3)
  f = lambda a, b: a @ b  # noqa: E731
  spec = kernels.parse_kut(f"ffi:{libs[0]}:MyMatmul", kernel="dot_general")
  sub = jax.jit(peat.substitute(f, *peat.resolve_kut(spec)))
  with pytest.raises(peat.PeatError) as err:  # the handler binds F32 only
    sub(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
  text = str(err.value)
  assert "fwd/dot_general:0" in text and "MyMatmul failed" in text
  assert "bfloat16[1, 4, 8]" in text and "dot_general FFI calling" in text
  # A handler of another convention (softmax's one operand, no attribute).
  wrong = kernels.parse_kut(f"ffi:{libs[1]}:MySoftmax", kernel="layer_norm")
  ln = nnx.LayerNorm(8, rngs=nnx.Rngs(0))
  with pytest.raises(peat.PeatError, match="MySoftmax failed on the operands "
                     "of a layer_norm call"):
    jax.jit(peat.substitute(lambda x: ln(x), *peat.resolve_kut(wrong)))(a)
  # No backward target: its VJP says so.
  kut = kernels.kut.kut_callable(spec)
  with pytest.raises(peat.PeatError, match="has no backward target"):
    jax.grad(lambda a: jnp.sum(kut(a, b, dimension_numbers=(((1,), (0,)),
                                                            ((), ())))))(a)
