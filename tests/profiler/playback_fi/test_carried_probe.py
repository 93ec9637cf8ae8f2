"""The carried port probe on the device answers as the host probe does.

``CarriedProbes`` tries a carried input-precision hypothesis of primitive
sites in one x64 executable (given the reference and the hypothesis on
the device). On real matmul sites (a float32 and a bf16
output; the KUT computing on bf16- or tf32-rounded inputs, and one
computing in float32 with another order, which no rounding explains) its
figures are ``port_probe(only=...)``'s on the host: the median ratio bit
for bit, the RMS distances to summation order, the hypothesis rounded to
the output's dtype and its float32 halves bit for bit. ``nearest`` rounds
float64 once, as NumPy's ``astype`` (XLA's own float64 -> bf16 rounds twice,
by way of float32).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax.analyzer.signature import split_reference
from peat_jax.injectors import round_nearest
from peat_jax.core import FORMATS
from peat_jax.profiler.playback_fi._carried_probe import CarriedProbes
from peat_jax.profiler.playback_fi._carried_probe import nearest


def _values(seed: int) -> np.ndarray:
  """float64 values over many octaves, bf16 ties and near-ties, the
  range's edges, infinities and NaN (bf16's and float32's normal range:
  XLA on CPU flushes subnormal results to zero)."""
  rng = np.random.default_rng(seed)
  wide = rng.standard_normal(20_000) * 10.0 ** rng.integers(-30, 30, 20_000)
  b = rng.standard_normal(20_000).astype(ml_dtypes.bfloat16).astype(
      np.float64)
  octave = np.exp2(np.floor(np.log2(np.abs(b))))
  ties = b + octave * 2.0 ** -8  # halfway between two bf16 values
  near = ties * (1 + 2.0 ** -40)  # just beyond: float32 would make a tie
  edges = np.array([3.3895313892515355e38, 3.3961e38, 3.3963e38, 1e39,
                    -1e39, np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0 ** -126,
                    -(2.0 ** -126)])
  return np.concatenate([wide, b, ties, near, edges])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16, np.float32])
def test_nearest_rounds_float64_once_as_numpy(dtype):
  x = _values(0)
  with np.errstate(over="ignore"):
    want = x.astype(dtype)
  with jax.enable_x64(True):
    got = np.asarray(jax.jit(lambda v: nearest(v, dtype))(x))
  bits = lambda a: a.view(np.uint16 if a.itemsize == 2 else np.uint32)
  nan = np.isnan(x)
  np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])
  assert np.isnan(got[nan].astype(np.float32)).all()
  if dtype == jnp.bfloat16:  # the case XLA's own conversion gets wrong
    with jax.enable_x64(True):
      xla = np.asarray(jax.jit(lambda v: v.astype(dtype))(x))
    assert (bits(xla) != bits(want)).sum() > 1000


def _matmul(out_dtype, fmt, seed: int):
  """A real (96, 80) x (80, 72) matmul site: inputs, golden, a KUT."""
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((96, 80)).astype(np.float32)
  b = rng.standard_normal((80, 72)).astype(np.float32)
  r = a.astype(np.float64) @ b.astype(np.float64)
  golden = (a @ b).astype(out_dtype)
  if fmt is None:  # float32 inputs, another summation order
    test = (a[:, :40] @ b[:40] + a[:, 40:] @ b[40:]).astype(out_dtype)
  else:
    ra, rb = (np.asarray(round_nearest(jnp.asarray(x), FORMATS[fmt]))
              for x in (a, b))
    test = (ra @ rb).astype(out_dtype)
  return (a, b), golden, test, r


def _hypothesis(inputs, fmt):
  """The kernel on its inputs rounded to ``fmt``, in float64 (as the
  probe's reference function computes it)."""
  a, b = (np.asarray(round_nearest(jnp.asarray(x), FORMATS[fmt]),
                     np.float64) for x in inputs)
  return a @ b


def _host(inputs, golden, test, r, fmt):
  return analyzer.port_probe(
      "dot_general", inputs, {}, test, golden, r,
      reference_fn=lambda x, y: np.asarray(x, np.float64) @ np.asarray(
          y, np.float64), signature="defer", only=f"inputs_{fmt}")


@pytest.mark.parametrize("out_dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("kut_fmt,fmt", [("bf16", "bf16"), ("tf32", "tf32"),
                                         (None, "bf16")])
def test_device_try_is_the_host_probe(out_dtype, kut_fmt, fmt):
  inputs, golden, test, r = _matmul(out_dtype, kut_fmt, seed=3)
  host = _host(inputs, golden, test, r, fmt)
  probes = CarriedProbes()
  with jax.enable_x64(True):
    dev_r, dev_h = jnp.asarray(r), jnp.asarray(_hypothesis(inputs, fmt))
  (got,) = probes(((0, fmt),), [jnp.asarray(test)], [jnp.asarray(golden)],
                  [dev_r], [dev_h])
  if host is None:  # within golden's noise on the host: so on the device
    assert not got.d_ref > analyzer.probes.BEYOND_GOLDEN * got.d_gold
    return
  assert got.ratio == host["ratio"]  # the same median, bit for bit
  np.testing.assert_allclose(got.d_ref, host["reference_distance"],
                             rtol=1e-12)
  np.testing.assert_allclose(got.distance, host["distance"], rtol=1e-12)
  answer = analyzer.probes.probe_answer(
      f"precision:{fmt}", f"inputs_{fmt}",
      analyzer.probes.precision_sentence(fmt), [f"inputs_{fmt}"],
      got.ratio, got.distance, got.d_ref, got.d_gold)
  assert answer["explains"] == host["explains"]
  assert answer["explains"] == (kut_fmt == fmt)
  assert answer["tried"] == host["tried"]
  if host["explains"]:  # the re-based Signature's inputs, bit for bit
    h = host["hypothesis"]
    gold, hi, lo = (np.asarray(v) for v in got.split)
    want_hi, want_lo = split_reference(h, h.shape, batched=False)
    want_gold = h.astype(np.dtype(out_dtype))
    bits = lambda a: a.view(np.uint16 if a.itemsize == 2 else np.uint32)
    np.testing.assert_array_equal(bits(gold), bits(want_gold))
    np.testing.assert_array_equal(hi, want_hi)
    np.testing.assert_array_equal(lo, want_lo)


def test_no_element_differs_gives_an_infinite_ratio():
  inputs, golden, _, r = _matmul(np.float32, "bf16", seed=4)
  probes = CarriedProbes()
  exact = r.astype(np.float32)
  with jax.enable_x64(True):
    dev_r = jnp.asarray(exact.astype(np.float64))  # t == r everywhere
    dev_h = jnp.asarray(_hypothesis(inputs, "bf16"))
  (got,) = probes(((0, "bf16"),), [jnp.asarray(exact)],
                  [jnp.asarray(golden)], [dev_r], [dev_h])
  assert got.ratio == np.inf and got.d_ref == 0.0


def test_later_checkpoints_run_the_tries_compiled_at_the_first(tmp_path):
  import peat_jax as peat
  from peat_jax import models
  task = models.get_task("cnn", batch_size=8)
  g = peat.golden_train(task, tmp_path / "golden", steps=2,
                        checkpoint_every=1, evaluate=False)
  state = peat.restore_state(g.checkpoint_dir, task, g.steps[0])
  player = peat.profiler.Player(task, "native:conv2d:in_bf16", state,
                                task.batch_at(int(state.data_position)))
  first = player.play(g.steps[0], state)
  tries = player._refs().carried  # pylint: disable=protected-access
  assert {r["decided_by"] for r in first[:-1]} == {"probe"}
  assert len(tries._compiled) == 1  # compiled at the first checkpoint
  traced = tries._jit._cache_size()  # the first's whole probes, traced
  later_state = peat.restore_state(g.checkpoint_dir, task, g.steps[1])
  later = player.play(g.steps[1], later_state)
  assert {r["decided_by"] for r in later[:-1]} == {"carried probe"}
  assert tries._jit._cache_size() == traced  # nothing traced again
