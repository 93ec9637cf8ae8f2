"""Scale-out of playback FI: throughput vs devices and processes.

Usage::

  python benchmarks/bench_scaleout.py [--checkpoints=24] [--out=scaleout.json]

Stages (each in fresh child processes, so every run compiles for itself):

* devices: ``sharded_playback`` of one golden run (an MLP, width 128, batch
  256, KUT ``native:matmul:default`` at its 2 forward dot sites) on 1, 2, 4
  and 8 local devices of a process started with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=8``;
* processes: the same playback with 1 and 2 processes (``jax.distributed``
  on loopback, one device each);
* cost of one checkpoint of a reference model (``cnn``, batch 64, the same
  KUT at its Linear site) on one device: restore, play (tapped and
  substituted steps, float64 reference, signature, diagnosis), and the
  first (compiling) checkpoint;
* merging shards: ``merge_shards`` of 64 shard files.

Reported per run: wall time from start to all records written (compilation
included), the first checkpoint's time per device (compilation), the steady
time of one checkpoint on one device (each device's first excluded, measured
while the others run) and the steady throughput ``devices / steady time``
(checkpoints/s). On a machine with few cores the forced host devices share
them: the ratios show the overheads, not the parallel speed of real devices.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

_CHECKPOINTS = flags.DEFINE_integer("checkpoints", 24,
                                    "Checkpoints played per run.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
_ROLE = flags.DEFINE_string("role", None, "Internal: child process role.")
_ARGS = flags.DEFINE_string("args", "{}", "Internal: child arguments.")

KUT = "native:matmul:default"


def mlp_task(batch_size: int = 256, width: int = 128):
  """A 2-layer MLP on seeded random data (2 forward dot_general sites)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  tx = optax.adam(1e-3)

  def init_state(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    p = {"w1": jax.random.normal(k1, (64, width)) * 0.1,
         "w2": jax.random.normal(k2, (width, width)) * 0.1}
    return peat.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p),
                           jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))

  def loss_fn(p, b):
    logits = jnp.tanh(b["x"] @ p["w1"]) @ p["w2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                           b["y"]).mean()

  def step_fn(state, b):
    loss, g = jax.value_and_grad(loss_fn)(state.params, b)
    u, o = tx.update(g, state.opt_state, state.params)
    return peat.TrainState(state.step + 1, optax.apply_updates(state.params, u),
                           o, state.rng, state.data_position + 1), {
                               "loss": loss, "grad_norm": optax.tree.norm(g),
                               "update_norm": optax.tree.norm(u)}

  def batch_at(pos):
    r = np.random.default_rng(int(pos))
    return {"x": r.standard_normal((batch_size, 64)).astype(np.float32),
            "y": r.integers(0, width, batch_size).astype(np.int32)}

  return peat.TrainTask(
      name="bench_mlp", config={"batch_size": batch_size, "width": width},
      init_state=init_state, step_fn=step_fn, train_step=jax.jit(step_fn),
      batch_at=batch_at, evaluate=lambda s: {}, default_steps=8,
      default_checkpoint_every=1, model_fn=lambda p, x: x)


# ----------------------------------------------------------- child roles


def _timed_playback(task, golden, campaign, devices):
  """Runs sharded_playback; times its progress lines (written in step order).

  Steady throughput: checkpoints written after line ``2 x devices`` (by
  then every device has compiled and played its first checkpoint) per
  second of wall time to the last line.
  """
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  first, stamps = {}, []
  t0 = time.perf_counter()

  def say(line):
    parts = line.split()
    if len(parts) > 4 and parts[3] == "on":  # "playback step S on DEV: ..."
      stamps.append(time.perf_counter())
      first.setdefault(parts[4].rstrip(":"), float(line.rsplit("(", 1)[1]
                                                    .split()[0]))
  r = peat.sharded_playback(task, golden, KUT, campaign_dir=campaign,
                                 devices=devices, progress=say)
  n = len(devices) if isinstance(devices, list) else (
      devices or len(jax.local_devices()))
  k = min(2 * n, len(stamps) - 2)
  steady = (len(stamps) - 1 - k) / (stamps[-1] - stamps[k])
  return {"wall_s": time.perf_counter() - t0, "steady_ckpt_per_s": steady,
          "per_device_s": r.seconds_per_step, "first_s": sorted(first.values()),
          "checkpoints": len(r.effects), "window": len(stamps) - 1 - k}


def _role_devices(a):
  return _timed_playback(mlp_task(), a["golden"], a["campaign"], a["devices"])


def _role_process(a):
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  if a["n"] > 1:
    peat.init_distributed(f"127.0.0.1:{a['port']}", a["n"], a["pid"])
  return _timed_playback(mlp_task(), a["golden"], a["campaign"], None)


def _role_golden(a):
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  peat.golden_train(mlp_task(), a["golden"], steps=a["checkpoints"],
                    checkpoint_every=1, evaluate=False)
  return {}


def _role_model_cost(a):
  """Per-checkpoint costs of the cnn scenario on one device."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  from peat_jax import models  # pylint: disable=import-outside-toplevel
  task = models.get_task("cnn")
  golden = os.path.join(a["dir"], "golden")
  peat.golden_train(task, golden, steps=a["n"], checkpoint_every=1,
                    evaluate=False)
  ckpt = os.path.join(golden, "checkpoints")
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restore, play = [], []
  t0 = time.perf_counter()
  state = peat.profiler.restore_on(ckpt, task, 0, sharding)
  player = peat.profiler.Player(task, KUT, state,
                            task.batch_at(int(state.data_position)),
                            select="*Linear*")
  player.play(0, state)
  first = time.perf_counter() - t0
  reader = peat.profiler.local_reader(ckpt)
  for s in range(1, a["n"]):
    t0 = time.perf_counter()
    state = peat.profiler.restore_on(ckpt, task, s, sharding, manager=reader)
    t1 = time.perf_counter()
    player.play(s, state)
    t2 = time.perf_counter()
    restore.append(t1 - t0)
    play.append(t2 - t1)
  reader.close()
  step = []
  batch = task.batch_at(0)
  for _ in range(10):
    t0 = time.perf_counter()
    jax.block_until_ready(task.train_step(state, batch))
    step.append(time.perf_counter() - t0)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  return {"first_s": first, "restore_s": float(np.median(restore)),
          "state_bytes": int(nbytes),
          "play_s": float(np.median(play)),
          "train_step_s": float(np.median(step[1:])),
          "sites": len(player.site_names)}


def _role_merge(a):
  import peat_jax as peat  # pylint: disable=import-outside-toplevel
  d = a["dir"]
  shards = os.path.join(d, "shards")
  os.makedirs(shards)
  rec = {"kind": "site", "kut": KUT, "site": "fwd/x:0",
         "signature": {f"f{i}": 0.5 for i in range(40)} | {
             "ulp_hist": list(range(64)), "bits_xor": list(range(32))},
         "diagnosis": {"model": "exact", "verdict": "pass", "evidence": "e"}}
  steps = 0
  for p in range(64):
    recs = []
    for k in range(a["steps_per_shard"]):
      s = p + 64 * k
      recs += [dict(rec, step=s, site=f"fwd/x:{i}") for i in range(20)]
      recs.append({"kind": "effect", "kut": KUT, "step": s})
      steps += 1
    peat.profiler.append_records(os.path.join(shards, f"process-{p}.msgpack"),
                            recs)
  t0 = time.perf_counter()
  added = peat.profiler.merge_shards(os.path.join(d, "playback.msgpack"), shards,
                                 list(range(steps)))
  dt = time.perf_counter() - t0
  assert added == steps
  return {"steps": steps, "records": steps * 21, "merge_s": dt,
          "bytes": os.path.getsize(os.path.join(d, "playback.msgpack")),
          "per_step_ms": 1e3 * dt / steps}


def _role_step_modes(a):
  """Golden train steps of 8 x rounds states: threads vs one SPMD program.

  (a) one thread per device, each state committed to its device, the same
  jitted step (compiled once per device); (b) the states stacked on a
  leading axis split over a ("ckpt",) mesh, one jitted shard_map whose body
  runs the unbatched step on its device's state (compiled once). Both are
  checked bitwise against the step on device 0.
  """
  import threading  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  task = mlp_task()
  devs = jax.devices()
  n, rounds = len(devs), a["rounds"]
  states = [task.init_state(i) for i in range(n * rounds)]
  batches = [task.batch_at(i) for i in range(n * rounds)]
  step = jax.jit(task.step_fn)
  ref = [jax.device_get(step(states[i], batches[i])[1]["loss"])
         for i in range(n)]

  def threads():
    out = [None] * len(states)

    def work(k):
      for i in range(k, len(states), n):
        s = jax.device_put(states[i], devs[k])
        out[i] = jax.block_until_ready(step(s, batches[i]))[1]["loss"]
    ts = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in ts:
      t.start()
    for t in ts:
      t.join()
    return out

  mesh = Mesh(np.array(devs), ("ckpt",))
  spmd_step = jax.jit(jax.shard_map(
      lambda s, b: jax.tree.map(lambda x: x[None], task.step_fn(
          jax.tree.map(lambda x: x[0], s), jax.tree.map(lambda x: x[0], b))),
      mesh=mesh, in_specs=P("ckpt"), out_specs=P("ckpt")))
  split = NamedSharding(mesh, P("ckpt"))

  def spmd():
    out = []
    for r in range(rounds):
      sl = slice(r * n, (r + 1) * n)
      s = jax.device_put(jax.tree.map(lambda *x: np.stack(x), *states[sl]),
                         split)
      b = jax.device_put(jax.tree.map(lambda *x: np.stack(x), *batches[sl]),
                         split)
      out += list(jax.device_get(spmd_step(s, b)[1]["loss"]))
    return out

  res = {}
  for name, fn in (("threads", threads), ("spmd", spmd)):
    t0 = time.perf_counter()
    first = fn()
    t1 = time.perf_counter()
    fn()
    t2 = time.perf_counter()
    res[name] = {"first_s": t1 - t0, "steady_ckpt_per_s": len(states) / (t2 - t1),
                 "bitwise": bool(all(np.array_equal(np.asarray(first[i]),
                                                    ref[i]) for i in range(n)))}
  t0 = time.perf_counter()
  for i in range(len(states)):
    jax.block_until_ready(step(states[i], batches[i]))
  res["one_device_ckpt_per_s"] = len(states) / (time.perf_counter() - t0)
  return res


_ROLES = {"devices": _role_devices, "step_modes": _role_step_modes, "process": _role_process,
          "golden": _role_golden, "model_cost": _role_model_cost,
          "merge": _role_merge}


# ----------------------------------------------------------------- parent


def _spawn(role, args, devices=8):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), f"--role={role}",
       f"--args={json.dumps(args)}"], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def _wait(proc):
  out, _ = proc.communicate()
  lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise RuntimeError(f"child failed ({proc.returncode}):\n{out[-4000:]}")
  return json.loads(lines[-1][7:])


def _port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _row(label, r):
  return (f"{label:<22} wall {r['wall_s']:7.1f} s  first ckpt (compile) "
          f"{max(r['first_s']):6.1f} s  steady {r['steady_ckpt_per_s']:6.2f} "
          f"ckpt/s over {r['window']} ckpts  ({r['per_device_s'] * 1e3:6.1f} "
          "ms per ckpt on one device)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _ROLE.value:
    print("RESULT " + json.dumps(_ROLES[_ROLE.value](json.loads(_ARGS.value))),
          flush=True)
    return
  n = _CHECKPOINTS.value
  out = {"cpu_count": os.cpu_count(), "checkpoints": n,
         "load_avg_start": os.getloadavg()}
  print(f"machine: {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; forced host devices share the cores")
  with tempfile.TemporaryDirectory() as tmp:
    golden = os.path.join(tmp, "golden")
    _wait(_spawn("golden", {"golden": golden, "checkpoints": n}, 1))
    base = None
    out["devices"] = {}
    for d in (1, 2, 4, 8):
      r = _wait(_spawn("devices", {"golden": golden, "devices": d,
                                   "campaign": os.path.join(tmp, f"d{d}")}))
      base = base or r["steady_ckpt_per_s"]
      print(f"{_row(f'{d} device(s), 1 proc', r)}  "
            f"x{r['steady_ckpt_per_s'] / base:.2f}", flush=True)
      out["devices"][d] = dict(r, ratio=r["steady_ckpt_per_s"] / base)
    out["processes"] = {}
    for p in (1, 2):
      port = _port()
      camp = os.path.join(tmp, f"p{p}")
      procs = [_spawn("process", {"golden": golden, "campaign": camp,
                                  "n": p, "pid": i, "port": port}, 1)
               for i in range(p)]
      rs = [_wait(x) for x in procs]
      thr = sum(r["steady_ckpt_per_s"] for r in rs)
      wall = max(r["wall_s"] for r in rs)
      print(f"{p} process(es), 1 dev   wall {wall:7.1f} s  first ckpt "
            f"(compile) {max(max(r['first_s']) for r in rs):6.1f} s  steady "
            f"{thr:6.2f} ckpt/s (sum over processes)  x{thr / base:.2f}",
            flush=True)
      out["processes"][p] = {"runs": rs, "steady_ckpt_per_s": thr,
                             "wall_s": wall, "ratio": thr / base}
    r = _wait(_spawn("step_modes", {"rounds": 4}))
    for k in ("threads", "spmd"):
      print(f"golden step, 8 devices, {k:<7}: first round (compile) "
            f"{r[k]['first_s']:5.1f} s, steady {r[k]['steady_ckpt_per_s']:6.1f}"
            f" states/s, bitwise vs device 0: {r[k]['bitwise']}", flush=True)
    print(f"golden step, 1 device sequential: "
          f"{r['one_device_ckpt_per_s']:6.1f} states/s", flush=True)
    out["step_modes"] = r
    r = _wait(_spawn("model_cost", {"dir": os.path.join(tmp, "cnn"), "n": 6},
                     1))
    print(f"cnn (batch 64, {r['sites']} site, state "
          f"{r['state_bytes'] / 1e6:.2f} MB): first checkpoint "
          f"{r['first_s']:.1f} s; then restore {r['restore_s'] * 1e3:.0f} ms "
          f"+ play {r['play_s'] * 1e3:.0f} ms per checkpoint; golden train "
          f"step {r['train_step_s'] * 1e3:.1f} ms", flush=True)
    out["cnn"] = r
    r = _wait(_spawn("merge", {"dir": os.path.join(tmp, "merge"),
                               "steps_per_shard": 16}, 1))
    print(f"merge of 64 shards: {r['steps']} steps, {r['records']} records, "
          f"{r['bytes'] / 1e6:.1f} MB in {r['merge_s']:.2f} s "
          f"({r['per_step_ms']:.2f} ms per step)", flush=True)
    out["merge"] = r
  out["load_avg_end"] = os.getloadavg()
  print(f"load average at the end: {os.getloadavg()[0]:.1f}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  app.run(main)
