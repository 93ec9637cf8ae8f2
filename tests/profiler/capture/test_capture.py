"""Tests of golden profiles with captures and op-level playback.

peat_jax/_capture.py, _capture_io.py, _oplevel.py. A tiny hand-made task
(conv, layer norm, dense, softmax; compiles in about a second) keeps these
tests fast; tests/tools/ run the same code on the CNN scenario.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import peat_jax as peat
from peat_jax import profiler as _campaign
from peat_jax.profiler.capture import _capture as _capture
from peat_jax.profiler.capture import _capture_io as io
from peat_jax.profiler.capture import _oplevel as _oplevel
from peat_jax import sites as _sites

STEPS, EVERY = 4, 2
SELECT = dict(capture_kernel=("conv_general_dilated", "dot_general",
                              "layer_norm"),
              capture_phase="fwd")
CAPTURE_STEPS = [0, 1, 3]
CONV = "fwd/conv_general_dilated:0"
NORM = "fwd/layer_norm:0"
DENSE = "fwd/dot_general:0"
BATCH, CLASSES = 8, 10


@peat.composite("layer_norm")
def _layer_norm(x, scale, bias, eps=1e-6):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * lax.rsqrt(var + eps) * scale + bias


@peat.composite("softmax")
def _softmax(x):
  return jax.nn.softmax(x, axis=-1)


_TX = optax.adam(1e-2)


def _loss(params, batch):
  # The layer norm, dense and softmax outputs are float32[8, 10], as the
  # CNN's dense layer in tests/tools: one Analyzer compilation for them all.
  h = lax.conv_general_dilated(batch["x"], params["conv"], (1, 1), "SAME",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = _layer_norm(jnp.tanh(h).reshape(BATCH, CLASSES), params["scale"],
                  params["bias"], eps=1e-5)
  p = _softmax(h @ params["dense"])
  return -jnp.mean(jnp.log(jnp.take_along_axis(p, batch["y"][:, None], 1)))


def _step_fn(state, batch):
  loss, grads = jax.value_and_grad(_loss)(state.params, batch)
  updates, opt = _TX.update(grads, state.opt_state, state.params)
  new = state._replace(step=state.step + 1,
                       params=optax.apply_updates(state.params, updates),
                       opt_state=opt, data_position=state.data_position + 1)
  return new, {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "update_norm": optax.tree.norm(updates)}


def _init_state(seed):
  rng = np.random.default_rng(seed)  # numpy: no compilation for the init
  normal = lambda scale, shape: jnp.asarray(
      scale * rng.standard_normal(shape), jnp.float32)
  params = {"conv": normal(0.3, (1, 1, 40, CLASSES)),
            "scale": jnp.ones((CLASSES,)), "bias": jnp.zeros((CLASSES,)),
            "dense": normal(0.5, (CLASSES, CLASSES))}
  return peat.TrainState(jnp.zeros((), jnp.int32), params, _TX.init(params),
                         jax.random.PRNGKey(seed + 1),
                         jnp.zeros((), jnp.int32))


def _batch_at(position):
  rng = np.random.default_rng(1000 + int(position))
  return {"x": rng.standard_normal((BATCH, 1, 1, 40)).astype(np.float32),
          "y": rng.integers(0, CLASSES, BATCH).astype(np.int32)}


@pytest.fixture(scope="module")
def task():
  return peat.TrainTask(
      name="tiny", config={"batch": BATCH}, init_state=_init_state,
      step_fn=_step_fn, train_step=jax.jit(_step_fn), batch_at=_batch_at,
      evaluate=lambda state: {}, default_steps=STEPS,
      default_checkpoint_every=EVERY, model_fn=None)


@pytest.fixture(scope="module")
def sizes(task):
  """Planned record size of each selected site."""
  state, batch = peat.abstract_state(task), task.batch_at(0)
  chosen, _, tapped = _capture._select(  # pylint: disable=protected-access
      task, state, batch, {"sites": None, "kernel": SELECT["capture_kernel"],
                           "phase": "fwd"})
  shapes = jax.eval_shape(tapped, state, batch)[1]
  arrays = _capture._tap_arrays  # pylint: disable=protected-access
  return {s.name: io.planned_bytes(
      {k: (v.shape, v.dtype) for k, v in arrays(shapes[s.name]).items()})
          for s in chosen}


@pytest.fixture(scope="module")
def profiled(task, sizes, tmp_path_factory):
  # Every site at step 0; then only the dense record (the smallest) fits,
  # at step 1; nothing at step 3.
  assert min(sizes, key=sizes.get) == DENSE
  budget = sum(sizes.values()) + sizes[DENSE] + 10
  assert sizes[DENSE] + 10 < min(v for k, v in sizes.items() if k != DENSE)
  d = tmp_path_factory.mktemp("profile") / "c"
  r = _capture.profile(task, d, steps=STEPS, checkpoint_every=EVERY, **SELECT,
                       capture_steps=CAPTURE_STEPS, budget_bytes=budget)
  return r, budget


def test_captures_first_fit_in_priority_order_within_budget(profiled, sizes):
  r, budget = profiled
  order = list(sizes)  # execution order
  assert order == [CONV, NORM, DENSE]
  got = [(e["step"], e["site"]) for e in r.captured]
  assert got == [(0, CONV), (0, NORM), (0, DENSE), (1, DENSE)]
  skipped = [(s["step"], s["site"]) for s in r.skipped]
  assert skipped == [(1, CONV), (1, NORM), (3, CONV), (3, NORM), (3, DENSE)]
  assert all(s["reason"] == "over the budget" for s in r.skipped)
  files = [os.path.join(r.captures_dir, e["file"]) for e in r.captured]
  on_disk = sum(os.path.getsize(f) for f in files)
  assert on_disk == r.used_bytes <= budget
  for e in r.captured:
    assert os.path.getsize(os.path.join(r.captures_dir, e["file"])) <= sizes[
        e["site"]]
  index = io.read_index(r.captures_dir)
  assert index["records"] == r.captured and index["skipped"] == r.skipped


def test_captured_arrays_are_the_training_inputs(profiled, task):
  r, _ = profiled
  entries = {(e["step"], e["site"]): e for e in r.captured}
  conv = io.load_record(r.captures_dir, entries[(0, CONV)])
  assert set(conv) == {"in0", "in1", "out0"}
  np.testing.assert_array_equal(conv["in0"], task.batch_at(0)["x"])
  norm = io.load_record(r.captures_dir, entries[(0, NORM)])
  assert set(norm) == {"in0", "in1", "in2", "out0"}   # x, scale, bias
  # The dense weights at step 1 (not a checkpoint: replayed from step 0)
  # are the golden params after one update, bitwise.
  state, _ = task.train_step(task.init_state(0), task.batch_at(0))
  e = entries[(1, DENSE)]
  dense = io.load_record(r.captures_dir, e)
  np.testing.assert_array_equal(dense["in1"], np.asarray(state.params["dense"]))
  # The stored parameters rebuild the golden kernel.
  p = io.decode_params(e["params"])
  out = lax.dot_general(dense["in0"], dense["in1"], p["dimension_numbers"])
  np.testing.assert_allclose(out, dense["out0"], rtol=1e-5, atol=1e-6)


def test_capture_leaves_golden_run_bitwise_unchanged(profiled, task,
                                                     tmp_path):
  r, _ = profiled
  plain = peat.golden_train(task, tmp_path / "plain", steps=STEPS,
                            checkpoint_every=EVERY, evaluate=False)
  assert plain.steps == r.golden.steps == [0, 2, 4]
  for k in plain.log:
    np.testing.assert_array_equal(plain.log[k], r.golden.log[k])
  for s in plain.steps:
    a = peat.restore_state(plain.checkpoint_dir, task, s)
    b = peat.restore_state(r.golden.checkpoint_dir, task, s)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_rerun_resumes_and_other_settings_are_refused(profiled, task):
  r, budget = profiled
  lines = []
  again = _capture.profile(task, r.directory, steps=STEPS,
                           checkpoint_every=EVERY, **SELECT,
                           capture_steps=CAPTURE_STEPS, budget_bytes=budget,
                           progress=lines.append)
  assert again.captured == r.captured
  assert [l for l in lines if l.startswith("captured step")] == [
      "captured step 0: done before, skipped",
      "captured step 1: done before, skipped",
      "captured step 3: no record within the budget, skipped"]
  with pytest.raises(peat.PeatError, match="other settings.*budget_bytes"):
    _capture.profile(task, r.directory, steps=STEPS, checkpoint_every=EVERY,
                     **SELECT, capture_steps=CAPTURE_STEPS,
                     budget_bytes=budget + 1)


@pytest.mark.parametrize("sizes_, budget, kept", [
    ([5, 10, 3, 8], 12, [0, 2]),
    ([5, 10, 3, 8], 26, [0, 1, 2, 3]),
    ([4, 4, 4], 12, [0, 1, 2]),
    ([9, 2, 2], 10, [0]),
])
def test_plan_is_first_fit_in_priority_order(sizes_, budget, kept):
  site = _sites.Site("s", "k", "fwd", "", 0, False, (), (), (), (), (), False,
                     ())
  cands = [_capture.Candidate(i, site, b, f"f{i}")
           for i, b in enumerate(sizes_)]
  pl = _capture.plan(cands, budget)
  assert [c.step for c in pl.kept] == kept
  assert [c.step for c in pl.skipped] == [i for i in range(len(sizes_))
                                          if i not in kept]
  assert pl.planned_bytes == sum(sizes_[i] for i in kept) <= budget


def test_budget_below_one_record_fails_before_training(task, sizes,
                                                       tmp_path):
  name = min(sizes, key=sizes.get)
  with pytest.raises(peat.PeatError,
                     match=f"smaller than the smallest record \\("
                     f"{sizes[name]} bytes: site '{name}' at step 0"):
    _capture.profile(task, tmp_path / "c", steps=STEPS,
                     checkpoint_every=EVERY, **SELECT,
                     budget_bytes=sizes[name] - 1)
  assert not os.path.exists(tmp_path / "c" / "golden")


@pytest.mark.parametrize("kwargs, message", [
    (dict(capture_kernel="dot_general"), "needs a storage budget"),
    (dict(capture_kernel="dot_general", budget_bytes=10**6,
          capture_steps=[0, STEPS]), r"capture steps \[4\] are outside"),
    (dict(capture_sites="fwd/Nope/*", budget_bytes=10**6), "matches no site"),
    (dict(capture_kernel="dot_general", budget_bytes=0), "positive integer"),
])
def test_bad_arguments(task, tmp_path, kwargs, message):
  with pytest.raises(peat.PeatError, match=message):
    _capture.profile(task, tmp_path / "c", steps=STEPS,
                     checkpoint_every=EVERY, **kwargs)


@pytest.fixture()
def copy(profiled, tmp_path):
  r, _ = profiled
  d = tmp_path / "captures"
  shutil.copytree(r.captures_dir, d)
  entry = next(e for e in r.captured if e["site"] == DENSE)
  return str(d), entry


@pytest.mark.parametrize("damage, message", [
    ("truncate", "has .* bytes; expected .*truncated"),
    ("flip", "corrupt .*CRC"),
    ("index_sha", "corrupt .*another SHA-256 than the index"),
    ("delete", "is missing"),
    ("garbage", "corrupt"),
])
def test_damaged_capture_file_names_the_file(copy, damage, message):
  d, entry = copy
  path = os.path.join(d, entry["file"])
  data = bytearray(open(path, "rb").read())
  if damage == "truncate":
    data = data[:len(data) // 2]
  elif damage == "flip":
    data[-400] ^= 0x10   # inside out0's data, before the zip directory
  elif damage == "garbage":
    data = bytearray(b"\x00" * len(data))
  if damage == "delete":
    os.remove(path)
  elif damage == "index_sha":
    entry = dict(entry, arrays=dict(entry["arrays"]))
    entry["arrays"]["out0"] = dict(entry["arrays"]["out0"], sha256="0" * 64)
  else:
    open(path, "wb").write(bytes(data))
  with pytest.raises(peat.PeatError, match=message) as err:
    io.load_record(d, entry)
  assert path in str(err.value)


def test_corrupt_index_is_named(copy):
  d, _ = copy
  with open(os.path.join(d, io.INDEX_FILE), "w") as f:
    f.write('{"format": 1, "records": [')
  with pytest.raises(peat.PeatError, match="index.json is corrupt"):
    io.read_index(d)


@pytest.mark.parametrize("value", [
    None, True, 3, -2.5, float("inf"), "same",
    (1, (2, 3), ()), [1, 2], {"a": (1,), "b": None},
    np.float32(1e-6), jax.numpy.dtype("bfloat16"), np.float16,
    lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)),
    (lax.Precision.HIGHEST, lax.Precision.DEFAULT),
])
def test_params_codec_round_trips_through_json(value):
  back = io.decode_value(json.loads(json.dumps(io.encode_value(value, "p"))))
  expected = np.dtype(value) if isinstance(value, type) else value
  assert back == expected
  assert type(back) is type(expected) or isinstance(expected, np.dtype)


def test_params_codec_refuses_other_objects():
  with pytest.raises(peat.PeatError, match=r"parameter p\.f of type object"):
    io.encode_value({"f": object()}, "p")


@pytest.mark.parametrize("shape, dtype", [
    ((8, 10), "float32"), ((), "float32"), ((3, 1, 7), "bfloat16"),
    ((2, 3, 4, 5, 6, 7, 8, 9), "float16"), ((5,), "int32"), ((4,), "bool"),
])
def test_record_bytes_round_trip_within_planned_size(shape, dtype, tmp_path):
  rng = np.random.default_rng(len(shape))
  a = rng.standard_normal(shape).astype(np.float32).astype(
      jax.numpy.dtype(dtype))
  b = rng.standard_normal((3, 4)).astype(np.float32)
  data, meta = io.record_bytes({"in0": a, "out0": b})
  assert len(data) <= io.planned_bytes({"in0": (shape, dtype),
                                        "out0": ((3, 4), "float32")})
  io.write_file(str(tmp_path / "r.npz"), data)
  got = io.load_record(str(tmp_path), {"file": "r.npz", "bytes": len(data),
                                       "arrays": meta, "site": "s",
                                       "step": 0})
  assert got["in0"].dtype == a.dtype and got["in0"].shape == a.shape
  assert got["in0"].tobytes() == a.tobytes() and got["out0"].tobytes() == (
      b.tobytes())


# ------------------------------------------------------ op-level playback


@pytest.fixture(scope="module")
def ops_dir(profiled, tmp_path_factory):
  """A campaign directory whose captures are those of ``profiled``."""
  r, _ = profiled
  d = tmp_path_factory.mktemp("ops")
  shutil.copytree(r.captures_dir, d / _capture.CAPTURE_DIR)
  return d


def test_ops_golden_kut_is_exact_with_playback_record_format(ops_dir):
  lines = []
  r = _oplevel.playback_ops(ops_dir, "golden", progress=lines.append)
  assert r.sites == [DENSE]
  assert [(x["step"], x["site"]) for x in r.records] == [(0, DENSE),
                                                        (1, DENSE)]
  rec = r.records[0]
  assert {"kind", "kut", "step", "site", "kernel", "phase", "reduction",
          "signature", "diagnosis"} <= set(rec)
  assert rec["diagnosis"]["model"] == "exact" and rec["reduction"] == 10
  assert rec["source"] == "ops" and rec["golden_from"] == "rerun"
  assert isinstance(rec["golden_rerun_bit_equal"], bool)
  assert rec["capture"] == _capture.record_file(0, DENSE)
  assert r.localization is None
  assert lines[0].startswith(f"op {DENSE} step 0 (1/2): exact (pass)")
  # Running again skips what is done and appends nothing.
  again = _oplevel.playback_ops(ops_dir, "golden", progress=lines.append)
  assert lines[-1] == f"op {DENSE} step 1 (2/2): done before, skipped"
  assert again.records == r.records
  assert len(_campaign.read_records(r.path)) == 2


@pytest.mark.parametrize("spec, site, model, golden_from", [
    pytest.param("native:conv2d:in_bf16", CONV, "precision:bf16", "rerun",
                 marks=pytest.mark.slow),  # another Analyzer compilation
    ("native:layer_norm:in_bf16", NORM, "precision:bf16", "captured"),
])
def test_ops_native_kut_is_diagnosed(ops_dir, spec, site, model,
                                     golden_from):
  r = _oplevel.playback_ops(ops_dir, spec, steps=[0])
  rec, = r.records
  assert rec["site"] == site and rec["golden_from"] == golden_from
  assert rec["diagnosis"]["model"] == model, rec["diagnosis"]
  assert rec["signature"]["noise_ratio"] > 2
  assert r.localization == {"site": site, "step": 0,
                            "noise_ratio": rec["signature"]["noise_ratio"]}


def test_ops_report_rebuilds_from_ops_records(ops_dir):
  from peat_jax import profiler as _campaign_report  # pylint: disable=g-import-not-at-top
  _oplevel.playback_ops(ops_dir, "native:matmul:in_bf16", steps=[0])
  out = _campaign_report.rebuild_report(ops_dir, kut="native:matmul:in_bf16")
  data = json.loads(open(out.json).read())
  assert out.verdict == data["verdict"]["verdict"] == "warn"
  assert [s["site"] for s in data["sites"]] == [DENSE]
  assert data["playback"] is None and data["runtime"] is None
  assert os.path.getsize(out.html) > 1000


@pytest.mark.parametrize("kwargs, message", [
    (dict(kut_spec="native:matmul:default", select="fwd/nope*"),
     r"no such record was captured; captured \(kernel, phase\): .*"
     r"'dot_general', 'fwd'"),
    (dict(kut_spec="native:matmul:default", steps=[2]), "no such record"),
    (dict(kut_spec="native:matmul:nope"), "unknown KUT spec"),
])
def test_ops_bad_selection(ops_dir, kwargs, message):
  with pytest.raises(peat.PeatError, match=message):
    _oplevel.playback_ops(ops_dir, **kwargs)


def test_ops_without_captures_and_with_a_damaged_file(copy, tmp_path):
  with pytest.raises(peat.PeatError, match="no captures at"):
    _oplevel.playback_ops(tmp_path / "empty", "golden")
  d, entry = copy
  path = os.path.join(d, entry["file"])
  with open(path, "r+b") as f:
    f.truncate(100)
  with pytest.raises(peat.PeatError, match="capture file .* has 100 bytes"
                     ) as err:
    _oplevel.playback_ops(d, "native:matmul:default", steps=[0],
                          campaign_dir=tmp_path / "c")
  assert path in str(err.value)
