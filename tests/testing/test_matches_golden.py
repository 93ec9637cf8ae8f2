"""peat.testing.assert_matches_golden: the Detector's rule as an assertion.

A correct kernel of another order (softmax by explicit exp and sum, a
matmul summed in two halves) passes in float32 and bfloat16; a fault (one
tail counted twice), a precision loss (inputs rounded to bf16 in a float32
kernel) and a bit flip fail, naming their model; mismatched outputs are
bad input.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat


def _x(shape, seed, dtype):
  r = np.random.default_rng(seed)
  return jnp.asarray((r.standard_normal(shape) * 2).astype(np.float32)
                     ).astype(dtype)


def _softmax_other_order(x):
  xf = x.astype(jnp.float32)
  e = jnp.exp(xf - xf.max(-1, keepdims=True))
  s = e[..., ::2].sum(-1, keepdims=True) + e[..., 1::2].sum(-1,
                                                             keepdims=True)
  return (e / s).astype(x.dtype)


def _softmax_golden(x):
  return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_another_order_passes(dtype):
  x = _x((16, 384), 0, dtype)
  diag = peat.testing.assert_matches_golden(
      _softmax_other_order(x), _softmax_golden(x), peat.reference_softmax(x),
      context={"kernel": "softmax", "reduction": 384})
  assert diag.verdict == "pass" and diag.model in ("exact", "reordering")
  a, b = _x((24, 640), 1, dtype), _x((640, 48), 2, dtype)
  halves = (jnp.dot(a[:, :320].astype(jnp.float32),
                    b[:320].astype(jnp.float32))
            + jnp.dot(a[:, 320:].astype(jnp.float32),
                      b[320:].astype(jnp.float32))).astype(dtype)
  gold = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)).astype(dtype)
  diag = peat.testing.assert_matches_golden(
      halves, gold, peat.reference_matmul(a, b),
      context={"kernel": "dot_general", "reduction": 640})
  assert diag.verdict == "pass"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_fault_fails_with_its_model(dtype):
  x = _x((16, 192), 3, dtype)
  gold = _softmax_golden(x)
  xf = x.astype(jnp.float32)
  e = jnp.exp(xf - xf.max(-1, keepdims=True))
  twice = (e / (e.sum(-1, keepdims=True) + e[..., 128:].sum(
      -1, keepdims=True))).astype(dtype)  # the tail counted twice
  with pytest.raises(peat.testing.GoldenMismatchError,
                     match=r"\(fail\)") as err:
    peat.testing.assert_matches_golden(
        twice, gold, peat.reference_softmax(x),
        context={"kernel": "softmax", "reduction": 192})
  assert err.value.diagnosis.verdict == "fail"
  flipped = np.asarray(gold).copy().view(
      np.uint32 if dtype == jnp.float32 else np.uint16)
  flipped.reshape(-1)[[5, 900, 2000]] ^= 1 << (13 if dtype == jnp.bfloat16
                                                else 29)
  with pytest.raises(peat.testing.GoldenMismatchError):
    peat.testing.assert_matches_golden(
        flipped.view(np.asarray(gold).dtype), gold,
        peat.reference_softmax(x))


def test_precision_loss_fails_at_warn_and_passes_fail_on_fail():
  a, b = _x((32, 256), 4, jnp.float32), _x((256, 64), 5, jnp.float32)
  gold = jnp.dot(a, b)
  lossy = jnp.dot(a.astype(jnp.bfloat16).astype(jnp.float32),
                  b.astype(jnp.bfloat16).astype(jnp.float32))
  ref = peat.reference_matmul(a, b)
  ctx = {"kernel": "dot_general", "reduction": 256}
  with pytest.raises(peat.testing.GoldenMismatchError,
                     match="precision:bf16"):
    peat.testing.assert_matches_golden(lossy, gold, ref, context=ctx)
  diag = peat.testing.assert_matches_golden(lossy, gold, ref, context=ctx,
                                            fail_on="fail")
  assert diag.verdict == "warn"


def test_bad_input():
  x = _x((4, 8), 6, jnp.float32)
  with pytest.raises(peat.PeatError, match="expected float32"):
    peat.testing.assert_matches_golden(x[:2], x)
  with pytest.raises(peat.PeatError, match="fail_on must be"):
    peat.testing.assert_matches_golden(x, x, fail_on="pass")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_with_the_call_the_message_names_the_slip(dtype):
  """Given the call, the assertion searches the slip grammar on its
  inputs: a softmax whose last 64 terms are counted twice names the block
  (an exported repro passes its call)."""
  x = _x((16, 192), 7, dtype)
  gold = _softmax_golden(x)
  xf = x.astype(jnp.float32)
  e = jnp.exp(xf - xf.max(-1, keepdims=True))
  twice = (e / (e.sum(-1, keepdims=True) + e[..., 128:].sum(
      -1, keepdims=True))).astype(dtype)
  with pytest.raises(peat.testing.GoldenMismatchError,
                     match="block of 64 .* counted twice") as err:
    peat.testing.assert_matches_golden(
        twice, gold, peat.reference_softmax(x),
        context={"kernel": "softmax", "reduction": 192},
        call=("softmax", (x,), {}))
  assert err.value.diagnosis.params["slip"] == "blocked:twice:last:w64"
  diag = peat.testing.assert_matches_golden(
      _softmax_other_order(x), gold, peat.reference_softmax(x),
      call=("softmax", (x,), {}))
  assert diag.verdict == "pass"


def test_diagnose_call_checks_its_input():
  x = _x((4, 8), 8, jnp.float32)
  with pytest.raises(peat.PeatError, match="like the golden kernel's"):
    peat.detector.diagnose_call("softmax", (x,), {}, x[:2], x)
  with pytest.raises(peat.PeatError, match="no float64 reference"):
    peat.detector.diagnose_call("no_such_kernel", (x,), {}, x, x)
