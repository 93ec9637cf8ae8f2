"""Tests of the composite-kernel marker (peat_jax.sites._composite)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from peat_jax import sites as _sites
from peat_jax import sites as S
from peat_jax.sites import composite, composite_call
from peat_jax.core import PeatError


def _softmax(x, axis=-1):
  return jax.nn.softmax(x, axis=axis)


def _layer_norm(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _attention(q, k, v, mask=None):
  s = jnp.einsum("td,sd->ts", q, k)
  if mask is not None:
    s = jnp.where(mask, s, -1e9)
  return jax.nn.softmax(s) @ v


def _rand(i, shape):
  return jax.random.normal(jax.random.key(i), shape, jnp.float32)


CASES = {
    "softmax": (_softmax, lambda: ((_rand(0, (3, 5)),), {"axis": 0})),
    "gelu": (jax.nn.gelu, lambda: ((_rand(1, (4, 6)),), {})),
    "layer_norm": (_layer_norm, lambda: ((_rand(2, (3, 8)), 1 + _rand(3, (8,)), _rand(4, (8,))),
                                         {"eps": 1e-5})),
    "cross_entropy": (_cross_entropy, lambda: ((_rand(5, (4, 7)), jnp.array([0, 6, 3, 1])), {})),
    "attention": (_attention, lambda: ((_rand(6, (4, 8)), _rand(7, (5, 8)), _rand(8, (5, 8)),
                                        jnp.tril(jnp.ones((4, 5), bool))), {})),
}


def _float_loss(fn, args, kwargs):
  def loss(*floats):
    it = iter(floats)
    full = [next(it) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args]
    return jnp.sum(jnp.sin(fn(*full, **kwargs)))

  return loss


@pytest.mark.parametrize("kind", sorted(CASES))
def test_marked_function_computes_the_same_values_and_gradients(kind):
  fn, make = CASES[kind]
  args, kwargs = make()
  marked = composite(kind)(fn)
  floats = [a for a in args if jnp.issubdtype(a.dtype, jnp.floating)]
  np.testing.assert_array_equal(jax.jit(lambda *a: marked(*a, **kwargs))(*args),
                                jax.jit(lambda *a: fn(*a, **kwargs))(*args))
  g_marked = jax.jit(jax.grad(_float_loss(marked, args, kwargs), argnums=tuple(
      range(len(floats)))))(*floats)
  g_plain = jax.jit(jax.grad(_float_loss(fn, args, kwargs), argnums=tuple(
      range(len(floats)))))(*floats)
  for a, b in zip(g_marked, g_plain):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_marked_call_is_one_forward_and_one_backward_site(kind):
  fn, make = CASES[kind]
  args, kwargs = make()
  marked = composite(kind)(fn)
  floats = [a for a in args if jnp.issubdtype(a.dtype, jnp.floating)]
  sites = _sites.discover_sites(jax.grad(_float_loss(marked, args, kwargs)), *floats)
  mine = [s for s in sites if s.composite]
  assert [s.name for s in mine] == [f"fwd/{kind}:0", f"bwd/{kind}:0"]
  fwd, bwd = mine
  assert fwd.in_shapes == tuple(a.shape for a in args)  # every array argument
  assert bwd.in_shapes == fwd.in_shapes + fwd.out_shapes  # inputs, then cotangents
  assert bwd.out_shapes == tuple(a.shape for a in floats)  # float arguments only


def test_kut_gets_the_marked_signature_with_statics():
  seen = []

  def kut(x, axis=-1):
    seen.append(axis)
    return jax.nn.softmax(x, axis=axis) * 2.0

  marked = composite("softmax")(_softmax)
  x = _rand(9, (3, 4))
  f = lambda st, x: marked(x, axis=0)
  out = jax.jit(S.substitute(f, S.Substitution(kut, kernel="softmax")))(None, x)
  np.testing.assert_allclose(out, 2 * jax.nn.softmax(x, axis=0), rtol=1e-6)
  assert seen == [0]


@jax.custom_vjp
def _softmax_kut(x):
  return jax.nn.softmax(x)


_softmax_kut.defvjp(lambda x: (jax.nn.softmax(x), x), lambda x, g: (jnp.full_like(g, 3.0),))


def test_backward_site_uses_the_kuts_own_vjp():
  marked = composite("softmax")(_softmax)
  x = _rand(10, (2, 3))
  f = lambda st, x: jax.grad(lambda x: marked(x).sum())(x)
  got = jax.jit(S.substitute(f, S.Substitution(_softmax_kut, kernel="softmax", phase="bwd")))(None, x)
  np.testing.assert_array_equal(got, jnp.full_like(x, 3.0))


def test_composite_call_wraps_an_nnx_module():
  ln = nnx.LayerNorm(6, rngs=nnx.Rngs(0))
  x = _rand(11, (2, 6))
  want = ln(x)
  np.testing.assert_allclose(composite_call("layer_norm", ln, x), want, rtol=1e-6)
  graphdef, state = nnx.split(ln)

  def f(state, x):
    return composite_call("layer_norm", nnx.merge(graphdef, state), x)

  names = _sites.discover_sites(f, state, x).names()
  assert "fwd/layer_norm:0" in names
  got = []

  def kut(module, x):
    got.append(type(module).__name__)
    return module(x) + 1.0

  out = jax.jit(S.substitute(f, S.Substitution(kut, kernel="layer_norm")))(state, x)
  np.testing.assert_allclose(out, want + 1.0, rtol=1e-6)
  assert got == ["LayerNorm"]
  # Gradients reach the module's parameters through the marked call.
  g = jax.grad(lambda s: f(s, x).sum())(state)
  assert float(jnp.abs(g["bias"][...]).sum()) > 0


def test_nested_composites_and_vmap():
  inner = composite("softmax")(_softmax)

  @composite("attention")
  def attn(q, k, v):
    return inner(q @ k.T) @ v

  q, k, v = _rand(12, (3, 4, 8)), _rand(13, (3, 5, 8)), _rand(14, (3, 5, 8))
  f = lambda st, q, k, v: jax.vmap(attn)(q, k, v)
  sites = _sites.discover_sites(f, None, q, k, v)
  assert [s.name for s in sites if s.composite] == ["fwd/attention:0", "fwd/attention/softmax:0"]
  assert sites.by_name()["fwd/attention:0"].in_shapes == ((3, 4, 8), (3, 5, 8), (3, 5, 8))
  want = jax.jit(jax.vmap(lambda q, k, v: jax.nn.softmax(q @ k.T) @ v))(q, k, v)
  np.testing.assert_allclose(jax.jit(f)(None, q, k, v), want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["", "soft max", "peat:x", 3])
def test_invalid_kind_is_refused(kind):
  with pytest.raises(PeatError, match="composite kind must be"):
    composite(kind)
