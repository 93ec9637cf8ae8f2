"""The KUT's VJP at backward sites: pairing and ``Substitution(backward="kut")``.

Small Flax nnx train steps (dense layers with a GELU composite, a strided
convolution, a scan over layers) cover what ``peat_jax.sites._pairing``
must pair: transposed ``dot_general`` and ``conv_general_dilated`` sites
with the forward calls they transpose, composites' backward sites with
their forward sites, and what it must refuse.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

from peat_jax import sites as S
from peat_jax.core import PeatError
from peat_jax.kernels import kut as K
from peat_jax.profiler import TrainState


@S.composite("gelu")
def gelu(x):
  return jax.nn.gelu(x)


class Mlp(nnx.Module):

  def __init__(self, rngs):
    self.l1 = nnx.Linear(8, 16, rngs=rngs)
    self.l2 = nnx.Linear(16, 4, rngs=rngs)

  def __call__(self, x):
    return self.l2(gelu(self.l1(x)))


class ConvNet(nnx.Module):

  def __init__(self, rngs):
    self.c1 = nnx.Conv(1, 4, (3, 3), rngs=rngs)
    self.c2 = nnx.Conv(4, 8, (3, 3), strides=(2, 2), rngs=rngs)
    self.head = nnx.Linear(4 * 4 * 8, 4, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.c2(nnx.relu(self.c1(x))))
    return self.head(h.reshape(h.shape[0], -1))


def _task(model_cls, xshape, seed=0):
  """``(step_fn, state, batch)`` of a 4-class classifier trained by SGD."""
  graphdef, params = nnx.split(model_cls(nnx.Rngs(seed)), nnx.Param)
  params = nnx.to_pure_dict(params)
  tx = optax.sgd(0.1)

  def step_fn(state, batch):
    x, y = batch

    def loss_fn(p):
      logits = nnx.merge(graphdef, p)(x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt = tx.update(grads, state.opt_state, state.params)
    return (TrainState(state.step + 1, optax.apply_updates(state.params, updates),
                       opt, state.rng, state.data_position + 1),
            {"loss": loss, "grad_norm": optax.tree.norm(grads)})

  rng = np.random.default_rng(seed + 1)
  batch = (rng.standard_normal(xshape).astype(np.float32),
           rng.integers(0, 4, xshape[0]).astype(np.int32))
  state = TrainState(jnp.int32(0), params, tx.init(params),
                     jax.random.key_data(jax.random.key(seed)), jnp.int32(0))
  return step_fn, state, batch


TASKS = {"mlp": (Mlp, (6, 8)), "conv": (ConvNet, (3, 8, 8, 1))}
_CACHE = {}


def task(name):
  if name not in _CACHE:
    _CACHE[name] = _task(*TASKS[name])
  return _CACHE[name]


KERNELS = {"mlp": "dot_general", "conv": "conv_general_dilated"}


def _bind(prim):
  def kut(lhs, rhs, **params):
    return prim.bind(lhs, rhs, **params)
  return kut


GOLDEN_CLONE = {"dot_general": _bind(lax.dot_general_p),
                "conv_general_dilated": _bind(lax.conv_general_dilated_p)}


def _scaled_kut(out_scale: float, rhs_grad_scale: float):
  """A dot_general KUT: its output times ``out_scale``, and a VJP (of the
  exact product) whose rhs (weight) cotangent is ``rhs_grad_scale`` times
  the right one."""

  def kut(lhs, rhs, *, dimension_numbers, **unused):
    del unused
    dot = lambda a, b: lax.dot_general(a, b, dimension_numbers)

    @jax.custom_vjp
    def f(a, b):
      return dot(a, b) * jnp.float32(out_scale)

    def fwd(a, b):
      return f(a, b), (a, b)

    def bwd(res, g):
      da, db = jax.vjp(dot, *res)[1](g)
      return da, db * jnp.float32(rhs_grad_scale)

    f.defvjp(fwd, bwd)
    return f(lhs, rhs)

  return kut


_scaled_rhs_kut = _scaled_kut(1.0, 1.5)


# ---------------------------------------------------------------- pairing


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_transposed_site_pairs_with_the_forward_call_it_transposes(name):
  step_fn, state, batch = task(name)
  table = S.discover_sites(step_fn, state, batch)
  kernel = KERNELS[name]
  fwd = [s for s in table if s.kernel == kernel and s.phase == "fwd"]
  bwd = [s for s in table if s.kernel == kernel and s.phase == "bwd"]
  found = S.backward_sites(step_fn, state, batch,
                           forward=[s.name for s in fwd])
  assert sorted(b.site.name for b in found if b.site.kernel == kernel) == \
      sorted(s.name for s in bwd)
  for f in fwd:
    mine = [b for b in found if b.forward == f.name]
    assert all(b.kind == "vjp" and b.params is not None for b in mine)
    # The first layer's input is data: only its weight gets a cotangent.
    shapes = sorted(b.site.out_shapes[0] for b in mine)
    expected = ([f.in_shapes[1]] if f is fwd[0] else
                sorted([f.in_shapes[0], f.in_shapes[1]]))
    if kernel == "dot_general":  # dW is computed transposed, dx is not
      shapes = sorted(tuple(sorted(s)) for s in shapes)
      expected = sorted(tuple(sorted(s)) for s in expected)
    assert shapes == expected, f.name
  if name != "mlp":
    return
  # Selecting one forward site adds exactly its own backward sites.
  one = S.backward_sites(step_fn, state, batch, forward=[fwd[-1].name])
  assert {b.site.name for b in one if b.site.kernel == kernel} == {
      b.site.name for b in found if b.forward == fwd[-1].name}


def test_composite_backward_site_pairs_with_its_forward_site():
  step_fn, state, batch = task("mlp")
  found = S.backward_sites(step_fn, state, batch, forward=["fwd/Mlp/gelu:0"])
  assert [(b.site.name, b.kind, b.forward) for b in found] == [
      ("bwd/Mlp/gelu:0", "composite_vjp", "fwd/Mlp/gelu:0")]


# ------------------------------------------------------ the KUT's VJP runs


@pytest.mark.parametrize("name", sorted(TASKS))
def test_golden_clone_vjp_is_exact_at_every_backward_site(name):
  """(a) A KUT that is the golden primitive: its VJP is the golden one."""
  step_fn, state, batch = task(name)
  kernel = KERNELS[name]
  for kut in (S.GOLDEN, GOLDEN_CLONE[kernel]):
    tapped = jax.jit(S.tap(step_fn, S.Substitution(
        kut, kernel=kernel, phase="fwd", backward="kut")))
    _, taps = tapped(state, batch)
    assert any(n.startswith("bwd/") for n in taps)
    for n, t in taps.items():
      np.testing.assert_array_equal(np.asarray(t.kut), np.asarray(t.golden),
                                    err_msg=n)
      assert np.abs(np.asarray(t.golden)).max() > 0, n  # never on zeros


def test_wrong_vjp_shows_at_the_weight_gradient_sites_only():
  """(b) An exact forward with a wrong VJP: forward and dx exact, dW off."""
  step_fn, state, batch = task("mlp")
  tapped = jax.jit(S.tap(step_fn, S.Substitution(
      _scaled_rhs_kut, kernel="dot_general", phase="fwd", backward="kut")))
  _, taps = tapped(state, batch)
  table = S.discover_sites(step_fn, state, batch)
  weights = {s.in_shapes[1] for s in table
             if s.kernel == "dot_general" and s.phase == "fwd"}
  seen = {"fwd": 0, "dx": 0, "dw": 0}
  for n, t in taps.items():
    k, g = np.asarray(t.kut), np.asarray(t.golden)
    if n.startswith("fwd/") or tuple(sorted(g.shape)) not in {
        tuple(sorted(w)) for w in weights}:
      seen["fwd" if n.startswith("fwd/") else "dx"] += 1
      np.testing.assert_array_equal(k, g, err_msg=n)
    else:
      seen["dw"] += 1
      # The KUT's own VJP dot, scaled: its sums round like golden's up to a
      # few units of float32 at the tensor's scale (another program may sum
      # in another order), far from the unscaled golden (0.5 |g|).
      np.testing.assert_allclose(
          k, 1.5 * g, rtol=0, atol=64 * 2.0**-24 * np.abs(g).max(), err_msg=n)
  assert seen == {"fwd": 2, "dx": 1, "dw": 2}


def test_substituted_step_uses_the_kuts_vjp():
  step_fn, state, batch = task("mlp")
  sub = S.Substitution(_scaled_rhs_kut, kernel="dot_general", phase="fwd",
                       backward="kut")
  golden = jax.jit(step_fn)(state, batch)[0]
  new = jax.jit(S.substitute(step_fn, sub))(state, batch)[0]
  for layer in ("l1", "l2"):  # sgd: the update is -lr * grad
    du = np.asarray(new.params[layer]["kernel"] - state.params[layer]["kernel"])
    dg = np.asarray(golden.params[layer]["kernel"]
                    - state.params[layer]["kernel"])
    np.testing.assert_allclose(du, 1.5 * dg, rtol=1e-4, atol=1e-7)
  fwd_only = jax.jit(S.substitute(step_fn, sub._replace(backward="golden")))
  for a, b in zip(jax.tree.leaves(fwd_only(state, batch)),
                  jax.tree.leaves(jax.jit(step_fn)(state, batch))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_native_conv2d_runs_its_backward_target_at_backward_sites():
  """The transposed convolutions of a conv's backward (other dimension
  numbers, input dilation for the strided conv) are no native conv2d
  forward calls; backward="kut" runs the native backward target instead."""
  step_fn, state, batch = task("conv")
  native = K.kut_callable("native:conv2d:default")
  with pytest.raises(PeatError, match="native conv2d cannot run at site"):
    jax.eval_shape(S.tap(step_fn, S.Substitution(
        native, kernel="conv_general_dilated", phase="bwd")), state, batch)
  _, taps = jax.jit(S.tap(step_fn, S.Substitution(
      native, kernel="conv_general_dilated", phase="fwd",
      backward="kut")))(state, batch)
  bwd = [n for n in taps if n.startswith("bwd/")]
  assert len(bwd) == 3  # dW of both convs, dx of the second
  for n in bwd:
    k, g = np.asarray(taps[n].kut), np.asarray(taps[n].golden)
    assert not np.array_equal(k, g)  # another summation order...
    np.testing.assert_allclose(k, g, rtol=1e-4, atol=1e-6 * np.abs(g).max())


def test_fraction_schedule_decides_a_backward_site_with_its_forward_call():
  """A call of the KUT is its forward and its backward: under a seeded
  fraction of calls both sides of one forward call switch together."""
  step_fn, state, batch = task("mlp")
  sub = S.Substitution(_scaled_kut(1.001, 1.5),
                       sites=("fwd/Mlp/Linear/dot_general:1",),
                       backward="kut", schedule=S.Fraction(0.5, seed=3))
  step = jax.jit(S.substitute(step_fn, sub))
  golden = jax.jit(step_fn)
  decisions = []
  for i in range(12):
    st = state._replace(step=jnp.int32(i))
    (new, m), (g, gm) = step(st, batch), golden(st, batch)
    du = np.asarray(new.params["l2"]["kernel"] - st.params["l2"]["kernel"])
    dg = np.asarray(g.params["l2"]["kernel"] - st.params["l2"]["kernel"])
    forward_ran = bool(m["loss"] != gm["loss"])
    backward_ran = bool(np.allclose(du, 1.5 * dg, rtol=1e-2))
    assert backward_ran or np.allclose(du, dg, rtol=1e-2)
    decisions.append((forward_ran, backward_ran))
  assert all(f == b for f, b in decisions), decisions
  assert {f for f, _ in decisions} == {True, False}  # p = 0.5: both happen


def test_a_backward_site_without_its_forward_inputs_is_refused():
  """A scan without remat: the backward loop reads the forward operands
  from stacked residuals; peat_jax cannot pair its sites and says so."""
  def step_fn(w, x):
    def loss(w):
      def body(h, wi):
        return jnp.tanh(h @ wi), None
      return lax.scan(body, x, w)[0].sum()
    return jax.grad(loss)(w)

  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((3, 4, 4)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((2, 4)), jnp.float32)
  sub = S.Substitution(GOLDEN_CLONE["dot_general"], kernel="dot_general",
                       phase="fwd", backward="kut")
  with pytest.raises(PeatError, match=r"backward site 'bwd/dot_general:\d' "
                     r"cannot run the KUT's VJP: no forward call.*Fix: "
                     r"backward='golden'"):
    jax.eval_shape(S.substitute(step_fn, sub), w, x)
  jax.eval_shape(S.substitute(step_fn, sub._replace(kut=S.GOLDEN)), w, x)


def test_explicitly_named_backward_site_runs_the_vjp_alone():
  step_fn, state, batch = task("mlp")
  table = S.discover_sites(step_fn, state, batch)
  bwd = [s.name for s in table if s.kernel == "dot_general" and s.phase == "bwd"]
  found = S.backward_sites(step_fn, state, batch, backward=bwd[:1])
  assert [b.site.name for b in found] == bwd[:1] and found[0].kind == "vjp"
  _, taps = jax.jit(S.tap(step_fn, S.Substitution(
      _scaled_rhs_kut, sites=tuple(bwd), backward="kut")))(state, batch)
  assert sorted(taps) == sorted(bwd)


# ----------------------------------- a wider result than its operands (bf16)


class Logits(nnx.Module):
  """bf16 operands, float32 result: a bf16 model's attention logits."""

  def __init__(self, rngs):
    self.l1 = nnx.Linear(32, 48, rngs=rngs)
    self.l2 = nnx.Linear(48, 4, rngs=rngs)

  def __call__(self, x):
    h = self.l1(x).astype(jnp.bfloat16)
    w = self.l2.kernel[...].astype(jnp.bfloat16)
    return lax.dot_general(h, w, (((1,), (0,)), ((), ())),
                           preferred_element_type=jnp.float32)


def test_a_narrow_operands_cotangent_is_compared_in_its_dtype():
  """JAX transposes a bf16 x bf16 -> float32 dot by a float32 dot whose
  result it rounds to bf16 one equation later; a KUT's VJP returns the
  cotangent in bf16 (JAX's rule). The backward site compares both in
  bf16: a correct native KUT there passes, where the float32 comparison
  reads the shared rounding as the KUT's precision loss."""
  from peat_jax import detector
  from peat_jax import analyzer
  from peat_jax.profiler.playback_fi import _site_records as R
  step_fn, state, batch = _task(Logits, (64, 32), seed=3)
  table = S.discover_sites(step_fn, state, batch)
  fwd = [s for s in table if s.kernel == "dot_general" and s.phase == "fwd"
         and s.in_dtypes[0] == "bfloat16"]
  assert len(fwd) == 1
  found = S.backward_sites(step_fn, state, batch, forward=[fwd[0].name])
  narrow = [b for b in found if b.params.get("cotangent_dtype")]
  assert [b.params["cotangent_dtype"] for b in narrow] == ["bfloat16"] * 2
  wide = S.backward_sites(step_fn, state, batch, forward=[
      s.name for s in table if s.kernel == "dot_general" and s.phase == "fwd"
      and s.in_dtypes[0] == "float32"])
  assert not any(b.params.get("cotangent_dtype") for b in wide)
  kut = K.resolve_kut("native:matmul:default")[0].kut
  tapped = jax.jit(S.tap(step_fn, S.Substitution(
      kut, sites=tuple(b.site.name for b in narrow), backward="kut")))
  _, taps = tapped(state, batch)
  for b in narrow:
    tp = taps[b.site.name]
    assert tp.kut.dtype == jnp.float32  # the site's own output dtype
    ref = R.site_reference(b.site, b.params, tp.inputs)
    np.testing.assert_array_equal(  # the KUT's VJP holds bf16 values
        np.asarray(tp.kut), np.asarray(tp.kut.astype(jnp.bfloat16), np.float32))
    seen = R.as_trained(b.params, tp)
    assert seen.golden.dtype == seen.kut.dtype == jnp.bfloat16
    d = detector.detect(analyzer.analyze(seen.kut, seen.golden, ref),
                        context={"kernel": "dot_general"})
    assert d.verdict == "pass" and d.model in ("exact", "reordering"), d
    raw = detector.detect(analyzer.analyze(tp.kut, tp.golden, ref),
                          context={"kernel": "dot_general"})
    assert raw.model.startswith("precision") and raw.verdict == "warn", raw
