"""Tests of scale-out: peat_jax/_scaleout.py, _checkpoint_local.py,
_data_parallel.py and tools/scaleout.py.

Multi-device and multi-process checks run this file as a script in
subprocesses (``python tests/test_scaleout.py <role> <json>``): the pytest
process has started JAX with one CPU device, and
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` only acts before JAX
starts. Records are compared bitwise with single-device playback on this
machine (PITFALLS: the core count changes bits, the device count does not).
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import peat_jax as peat
from peat_jax import profiler as C
from peat_jax.profiler.scaleout import _data_parallel as D
from peat_jax import profiler as _records
from peat_jax import profiler as _runtime
from peat_jax.profiler.scaleout import _scaleout as S

KUT = "native:matmul:default"
HERE = os.path.abspath(__file__)


def tiny_task(batch_size: int = 32, width: int = 5) -> peat.TrainTask:
  """A 2-layer MLP on seeded random data: two forward dot_general sites.

  Both sites have output shape (batch, width), so the Analyzer compiles once.
  """
  tx = optax.adam(1e-2)

  def init_state(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    p = {"l1": {"w": jax.random.normal(k1, (12, width)) * 0.3,
                "b": jnp.zeros((width,))},
         "l2": {"w": jax.random.normal(k2, (width, width)) * 0.3,
                "b": jnp.zeros((width,))}}
    return peat.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p),
                           jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))

  def loss_fn(p, batch):
    h = jnp.tanh(batch["x"] @ p["l1"]["w"] + p["l1"]["b"])
    logits = h @ p["l2"]["w"] + p["l2"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["y"]).mean()

  def step_fn(state, batch):
    loss, g = jax.value_and_grad(loss_fn)(state.params, batch)
    u, o = tx.update(g, state.opt_state, state.params)
    return peat.TrainState(state.step + 1, optax.apply_updates(state.params, u),
                           o, state.rng, state.data_position + 1), {
                               "loss": loss, "grad_norm": optax.tree.norm(g),
                               "update_norm": optax.tree.norm(u)}

  def batch_at(pos):
    r = np.random.default_rng(1000 + int(pos))
    return {"x": r.standard_normal((batch_size, 12)).astype(np.float32),
            "y": r.integers(0, width, batch_size).astype(np.int32)}

  return peat.TrainTask(
      name="tiny_mlp", config={"batch_size": batch_size, "width": width},
      init_state=init_state, step_fn=step_fn, train_step=jax.jit(step_fn),
      batch_at=batch_at, evaluate=lambda s: {}, default_steps=4,
      default_checkpoint_every=1, model_fn=lambda p, x: x)


# --------------------------------------------------------- subprocesses


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _spawn(role: str, args: dict, devices: int = 8) -> subprocess.Popen:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen([sys.executable, HERE, role, json.dumps(args)],
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _result(proc: subprocess.Popen, timeout: float) -> dict:
  try:
    out, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"subprocess timed out after {timeout} s:\n{out[-3000:]}")
  lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, out[-3000:]
  return json.loads(lines[-1][len("RESULT "):])


def _role_sharded(a):
  r = S.sharded_playback(tiny_task(), a["golden"], KUT,
                         campaign_dir=a["campaign"], devices=a["devices"],
                         progress=print)
  return {"devices": len(jax.local_devices()), "n": len(r.records)}


def _role_process(a):
  S.init_distributed(f"127.0.0.1:{a['port']}", a["n"], a["pid"])
  r = S.sharded_playback(tiny_task(), a["golden"], KUT,
                         campaign_dir=a["campaign"], progress=print)
  return {"process": jax.process_index(), "count": jax.process_count(),
          "n": len(r.records)}


def _role_process_fail(a):
  """Process 1's batches cannot be made: every process must fail."""
  S.init_distributed(f"127.0.0.1:{a['port']}", 2, a["pid"])
  task = tiny_task()
  if a["pid"] == 1:
    def broken(pos):
      raise peat.PeatError(f"no batch at {pos} (test)")
    task = dataclasses.replace(task, batch_at=broken)
  try:
    S.sharded_playback(task, a["golden"], KUT, campaign_dir=a["campaign"])
  except peat.PeatError as e:
    return {"error": str(e)}
  return {"error": None}


def _role_dp_kut(a):
  """A sharded native KUT: bitwise vs one device, on every device, in HLO."""
  del a
  from jax import lax  # pylint: disable=import-outside-toplevel
  from peat_jax.kernels import kut  # pylint: disable=import-outside-toplevel
  mesh = D.data_mesh()
  rng = np.random.default_rng(7)
  lhs = rng.standard_normal((32, 3, 12)).astype(np.float32)
  rhs = rng.standard_normal((12, 5)).astype(np.float32)
  dn = (((2,), (0,)), ((), ()))
  native = kut.kut_callable(KUT)
  call = lambda f: jax.jit(lambda l, r: f(
      l, r, dimension_numbers=dn, precision=None, out_sharding=None,
      preferred_element_type=jnp.float32))(lhs, rhs)
  sharded = call(D.shard_kut(native, "dot_general", mesh))
  single = call(native)
  # On every device: a KUT that reports the mesh position it runs at.
  seen = []

  def counting(l, r, **p):
    jax.debug.callback(lambda i: seen.append(int(i)),
                       lax.axis_index(D.DATA_AXIS))
    return lax.dot_general_p.bind(l, r, **p)
  jax.block_until_ready(call(D.shard_kut(counting, "dot_general", mesh)))
  # In a data-parallel train step: the custom call on local shards.
  task = tiny_task()
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  state = jax.device_put(task.init_state(0), repl)
  batch = jax.device_put(task.batch_at(0), data)
  sub = D.data_parallel_substitution(task, state, batch, KUT, mesh)
  hlo = D._dp_step(peat.substitute(task.step_fn, sub), mesh).lower(
      state, batch).compile().as_text()
  calls = [l for l in hlo.splitlines()
           if 'custom_call_target="peat_matmul_fwd"' in l]
  odd = None
  try:
    call(lambda *x, **k: D.shard_kut(native, "dot_general", mesh)(
        x[0][:30], x[1], **k))
  except peat.PeatError as e:
    odd = str(e)
  return {"bitwise": bool(np.array_equal(np.asarray(sharded),
                                         np.asarray(single))),
          "rows_split": sharded.sharding.spec == jax.sharding.PartitionSpec(
              D.DATA_AXIS),
          "seen": sorted(seen), "partitions": "num_partitions=8" in hlo,
          "calls": calls, "odd": odd}


def _role_dp_runtime(a):
  task = tiny_task()
  kw = dict(frequencies=("every", "every_2"), steps=a["steps"], seeds=(1,))
  dp = D.data_parallel_runtime(task, a["golden"], KUT,
                               campaign_dir=a["campaign"], **kw)
  os.makedirs(a["campaign1"], exist_ok=True)
  one = _runtime.runtime(task, a["golden"], KUT, campaign_dir=a["campaign1"],
                         **kw)
  return {"dp": [r["loss"] for r in dp.runs] + [dp.golden_loss],
          "one": [r["loss"] for r in one.runs] + [one.golden_loss],
          "diverged": [r["diverged_at"] for r in dp.runs]}


_ROLES = {"sharded": _role_sharded, "process": _role_process,
          "process_fail": _role_process_fail,
          "dp_kut": _role_dp_kut, "dp_runtime": _role_dp_runtime}


# ------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def task():
  return tiny_task()


@pytest.fixture(scope="module")
def golden(task, tmp_path_factory):
  """A golden run of the tiny task: checkpoints 0..4 (plays 0..3)."""
  d = tmp_path_factory.mktemp("scaleout") / "golden"
  peat.golden_train(task, d, steps=4, checkpoint_every=1, evaluate=False)
  return str(d)


@pytest.fixture(scope="module")
def sequential(task, golden, tmp_path_factory):
  """Bytes of playback.msgpack from sequential playback on one device."""
  d = tmp_path_factory.mktemp("sequential")
  peat.playback(task, golden, KUT, campaign_dir=d)
  return (d / _records.PLAYBACK_FILE).read_bytes()


def _fake_step(step: int, kut: str = KUT, complete: bool = True) -> list:
  recs = [{"kind": "site", "kut": kut, "step": step, "site": f"fwd/s:{i}",
           "signature": {"noise_ratio": 0.5},
           "diagnosis": {"model": "exact", "verdict": "pass"}}
          for i in range(2)]
  return recs + ([{"kind": "effect", "kut": kut, "step": step}]
                 if complete else [])


# ---------------------------------------------------------- fast tests


def test_process_share_covers_todo_once():
  todo = [0, 2, 4, 6, 8, 10, 12]
  for n in (1, 2, 3, 8):
    shares = [S.process_share(todo, p, n) for p in range(n)]
    assert sorted(s for sh in shares for s in sh) == todo
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_merge_shards_step_order_no_duplicates(tmp_path):
  main = str(tmp_path / "playback.msgpack")
  shards = tmp_path / "shards"
  shards.mkdir()
  _records.append_records(main, _fake_step(0))
  _records.append_records(str(shards / "process-0.msgpack"),
                          _fake_step(4) + _fake_step(0) + _fake_step(8))
  _records.append_records(str(shards / "process-1.msgpack"),
                          _fake_step(2) + _fake_step(4) + _fake_step(6, complete=False)
                          + _fake_step(4, kut="other"))
  added = S.merge_shards(main, str(shards), order=[0, 2, 4, 6, 8])
  assert added == 4  # steps 2, 4, 8 of KUT and 4 of "other"; 6 is partial
  recs = _records.read_records(main)
  assert recs == (_fake_step(0) + _fake_step(2) + _fake_step(4)
                  + _fake_step(4, kut="other") + _fake_step(8))
  assert not shards.exists()
  assert S.merge_shards(main, str(shards)) == 0


def test_device_and_process_arguments_checked():
  with pytest.raises(peat.PeatError, match=r"devices=3: this process has 1"):
    S.local_devices(3)
  with pytest.raises(peat.PeatError, match="not local"):
    S.local_devices(["cpu:7"])
  assert S.local_devices(1) == jax.local_devices()[:1]
  with pytest.raises(peat.PeatError, match=r"process_id must be in \[0, 2\)"):
    S.init_distributed("127.0.0.1:1234", 2, 2)
  with pytest.raises(peat.PeatError, match="host:port"):
    S.init_distributed("localhost", 2, 0)
  with pytest.raises(peat.PeatError, match="no sharding rule for kernel"):
    D.shard_kut(lambda x: x, "attention", D.data_mesh(1))


def test_restore_on_equals_restore_state(task, golden):
  dev = jax.local_devices()[0]
  a = C.restore_on(os.path.join(golden, "checkpoints"), task, 2,
                   jax.sharding.SingleDeviceSharding(dev))
  b = peat.restore_state(golden, task, 2)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and np.array_equal(x, y)
    assert x.devices() == {dev}
  other = dataclasses.replace(task, name="other_task")
  with pytest.raises(peat.CheckpointError, match="belongs to task"):
    C.restore_on(os.path.join(golden, "checkpoints"), other, 2,
                 jax.sharding.SingleDeviceSharding(dev))


def test_resume_merges_leftover_shards_and_plans(task, golden, tmp_path):
  """A killed multi-process run left shards: merged, nothing replayed."""
  shards = tmp_path / S.SHARD_DIR
  shards.mkdir()
  _records.append_records(str(shards / "process-1.msgpack"),
                          _fake_step(3) + _fake_step(1))
  _records.append_records(str(shards / "process-0.msgpack"),
                          _fake_step(2) + _fake_step(0) + _fake_step(1, complete=False))
  lines = []
  r = S.sharded_playback(task, golden, KUT, campaign_dir=tmp_path,
                         progress=lines.append)
  assert _records.read_records(tmp_path / _records.PLAYBACK_FILE) == [
      x for s in (0, 1, 2, 3) for x in _fake_step(s)]
  assert [e["step"] for e in r.effects] == [0, 1, 2, 3]
  assert lines == [f"playback step {s}: done before, skipped"
                   for s in (0, 1, 2, 3)]
  assert not shards.exists()
  # A partial step in playback.msgpack is dropped by the plan.
  main = str(tmp_path / _records.PLAYBACK_FILE)
  _records.append_records(main, _fake_step(4, complete=False))
  assert S.plan_playback(os.path.join(golden, "checkpoints"), main, KUT,
                         [0, 1, 2, 3, 4]) == ([0, 1, 2, 3, 4], [4])
  assert all(x["step"] != 4 for x in _records.read_records(main))
  with pytest.raises(peat.PeatError, match=r"steps \[9\] are not saved"):
    S.plan_playback(os.path.join(golden, "checkpoints"), main, KUT, [9])


def test_data_parallel_one_device_equals_runtime(task, golden, tmp_path):
  kw = dict(frequencies=("every_2",), steps=2, seeds=(1,))
  dp = D.data_parallel_runtime(task, golden, KUT, devices=1,
                               campaign_dir=tmp_path / "dp", **kw)
  (tmp_path / "one").mkdir()
  one = peat.runtime(task, golden, KUT, campaign_dir=tmp_path / "one", **kw)
  assert dp.runs == one.runs and dp.spread == one.spread
  recs = _records.read_records(tmp_path / "dp" / D.RUNTIME_DP_FILE)
  assert {r["devices"] for r in recs} == {1}
  # Finished runs are skipped: the file does not grow.
  D.data_parallel_runtime(task, golden, KUT, devices=1,
                          campaign_dir=tmp_path / "dp", **kw)
  assert len(_records.read_records(
      tmp_path / "dp" / D.RUNTIME_DP_FILE)) == len(recs)


def test_sharded_kut_runs_on_every_device_bitwise():
  r = _result(_spawn("dp_kut", {}), timeout=300)
  assert r["bitwise"] and r["rows_split"]
  assert r["seen"] == list(range(8))
  assert r["partitions"] and len(r["calls"]) == 2  # two forward sites
  for line in r["calls"]:  # local shards: 32 rows / 8 devices = 4
    assert "custom-call(" in line and "f32[1,4," in line, line
  assert "size 30, not a multiple of the 8 devices" in r["odd"]


def test_tool_flag_errors(tmp_path, capsys):
  from peat_jax.tools import scaleout  # pylint: disable=import-outside-toplevel
  cases = [([], "--campaign_dir is required"),
           ([f"--campaign_dir={tmp_path}", "--checkpoints=a"], "must be integers"),
           ([f"--campaign_dir={tmp_path}", "--kut=native:nope:x"],
            "unknown KUT spec"),
           ([f"--campaign_dir={tmp_path}", "--mode=runtime",
             "--num_processes=2", "--coordinator=127.0.0.1:1"],
            "one host")]
  for args, msg in cases:
    scaleout.FLAGS.unparse_flags()
    scaleout.FLAGS(["scaleout"] + args)
    assert scaleout.main(["scaleout"]) == 2
    assert msg in capsys.readouterr().err


# ----------------------------------------------------------- slow tests


@pytest.mark.slow
def test_eight_devices_equal_sequential_bitwise(golden, sequential,
                                                tmp_path):
  r = _result(_spawn("sharded", {"golden": golden, "campaign": str(tmp_path),
                                 "devices": None}), timeout=900)
  assert r["devices"] == 8 and r["n"] == 8
  assert (tmp_path / _records.PLAYBACK_FILE).read_bytes() == sequential


@pytest.mark.slow
def test_two_processes_merge_equals_sequential(golden, sequential, tmp_path):
  port = _free_port()
  procs = [_spawn("process", {"port": port, "n": 2, "pid": p,
                              "golden": golden, "campaign": str(tmp_path)},
                  devices=1) for p in (0, 1)]
  res = [_result(p, timeout=900) for p in procs]
  assert [(r["process"], r["count"]) for r in res] == [(0, 2), (1, 2)]
  assert (tmp_path / _records.PLAYBACK_FILE).read_bytes() == sequential
  assert not (tmp_path / S.SHARD_DIR).exists()
  recs = _records.read_records(tmp_path / _records.PLAYBACK_FILE)
  keys = [(x["kind"], x["step"], x.get("site")) for x in recs]
  assert len(keys) == len(set(keys))


@pytest.mark.slow
def test_failing_process_fails_all_and_keeps_finished_steps(golden,
                                                            tmp_path):
  port = _free_port()
  procs = [_spawn("process_fail", {"port": port, "pid": p, "golden": golden,
                                   "campaign": str(tmp_path)}, devices=1)
           for p in (0, 1)]
  r0, r1 = [_result(p, timeout=900) for p in procs]
  assert "no batch at" in r1["error"]
  assert r0["error"].startswith("playback failed in process 1: PeatError")
  recs = _records.read_records(tmp_path / _records.PLAYBACK_FILE)
  assert sorted({r["step"] for r in recs}) == [0, 2]  # process 0's share


@pytest.mark.slow
def test_data_parallel_runtime_eight_devices_close(golden, tmp_path):
  r = _result(_spawn("dp_runtime", {
      "golden": golden, "campaign": str(tmp_path / "dp"),
      "campaign1": str(tmp_path / "one"), "steps": 4}), timeout=600)
  # Cross-device reductions sum in another order: close, not bitwise.
  np.testing.assert_allclose(np.array(r["dp"]), np.array(r["one"]),
                             rtol=1e-5, atol=0)
  assert r["diverged"] == [None, None]


@pytest.mark.slow
def test_tool_two_processes_then_resume(tmp_path):
  from peat_jax import models  # pylint: disable=import-outside-toplevel
  overrides = '{"model_kwargs": {"width": 4}}'
  task = models.get_task("cnn", batch_size=8, model_kwargs={"width": 4})
  peat.golden_train(task, tmp_path / "golden", steps=2, checkpoint_every=1,
                    evaluate=False)
  args = [f"--campaign_dir={tmp_path}", "--kut=native:matmul:default",
          "--batch_size=8", f"--overrides={overrides}"]
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  tool = [sys.executable, "-m", "peat_jax.tools.scaleout"]
  procs = [subprocess.Popen(
      tool + args + [f"--coordinator=127.0.0.1:{port}", "--num_processes=2",
                     f"--process_id={p}"], env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for p in (0, 1)]
  outs = [p.communicate(timeout=900)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  assert "[process 1] playback step 1 on" in outs[1]
  assert "records: " in outs[0] and "localization:" in outs[0]
  recs = _records.read_records(tmp_path / _records.PLAYBACK_FILE)
  assert [(r["step"], r["kind"]) for r in recs] == [
      (0, "site"), (0, "effect"), (1, "site"), (1, "effect")]
  assert recs[0]["site"] == "fwd/Cnn/Linear/dot_general:0"
  again = subprocess.run(tool + args + ["--devices=2"], text=True,
                         env=dict(env, XLA_FLAGS="--xla_force_host_platform"
                                  "_device_count=2"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=600, check=False)
  assert again.returncode == 0, again.stdout
  assert "playback step 1: done before, skipped" in again.stdout
  assert _records.read_records(tmp_path / _records.PLAYBACK_FILE) == recs


if __name__ == "__main__":
  print("RESULT " + json.dumps(_ROLES[sys.argv[1]](json.loads(sys.argv[2]))),
        flush=True)
