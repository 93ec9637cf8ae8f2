"""Forward fault-injection campaign: peat vs PyTorchFI, MRFI and a bare hook.

The campaign (one file, ``benchmarks/fi_peers/campaign_data.py``): a small
CNN (conv 1->16 3x3, conv 16->32 3x3, both "same" + ReLU, linear 2048->10)
trained on scikit-learn's 8x8 digits, a batch of 64 test digits and 1,000
single-bit flips into the outputs of conv1, conv2 and fc, each (layer,
sample, element, bit) drawn by a seeded NumPy generator. Each injection is
one whole forward pass of the batch with that one bit flipped; per injection
the batch's logits and per sample whether top-1 changed are recorded.

In one run, on the same file:

* the torch peers, in their own environment (``scripts/ensure_peers_env.sh``:
  torch CPU, PyTorchFI 0.6.0, MRFI 2.1.0) as a subprocess
  (``benchmarks/fi_peers/torch_runners.py``, which says how each tool injects):
  a bare torch forward hook, PyTorchFI, MRFI, best of ``--rounds`` timed
  passes over the list after a warm-up, tools back to back;
* peat (``run_peat``, in this process);
* a NumPy reference forward (float64 and float32) against torch's fault-free
  logits, and against the bare hook's faulted sample of every injection.

Every tool's logits are compared bitwise with the bare hook's, injection by
injection. torch runs on ``--threads`` threads (default 1: on 2 shared cores
two OpenMP threads stall at every barrier when one is preempted; measured
10 forwards/s vs 1,250 with one thread under load 4).

Usage:
  bash scripts/ensure_peers_env.sh     # once; the benchmark also calls it
  .venv/bin/python benchmarks/bench_fi_peers.py [--n 1000] [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fi_peers import campaign_data  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNERS = os.path.join(ROOT, "benchmarks", "fi_peers", "torch_runners.py")
PEERS_PY = os.path.join(ROOT, "benchmarks", "fi_peers", ".venv", "bin",
                        "python")
ENSURE = os.path.join(ROOT, "scripts", "ensure_peers_env.sh")


# ------------------------------------------------------------- peat side

#: The sites of the JAX model's layer outputs (the bias additions, as a
#: torch forward hook on conv1, conv2 and fc sees them), checked by
#: ``jax_model`` against ``peat.discover_sites``.
PEAT_SITES = ("fwd/add:0", "fwd/add:1", "fwd/add:2")


def jax_model(data):
  """The CNN in JAX (NCHW, torch's layouts): ``(fn, params, x)``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax import lax  # pylint: disable=g-import-not-at-top

  dn = ("NCHW", "OIHW", "NCHW")

  def conv(h, w, b):
    return lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),
                                    dimension_numbers=dn) + b[None, :, None,
                                                              None]

  def fn(p, x):
    h = jax.nn.relu(conv(x, p["conv1_w"], p["conv1_b"]))
    h = jax.nn.relu(conv(h, p["conv2_w"], p["conv2_b"]))
    return h.reshape(h.shape[0], -1) @ p["fc_w"].T + p["fc_b"]

  params = {k: jnp.asarray(data[k]) for k in (
      "conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc_w", "fc_b")}
  return fn, params, jnp.asarray(data["x"])


def run_peat(data, n: int, seed: int, rounds: int) -> dict:
  """The campaign with ``peat.forward_campaign``.

  ``n`` single-bit flips (``bitflip``, ``count=1``, every bit alike) into
  the outputs of conv1, conv2 and fc of the JAX model, each site chosen
  uniformly, then one element of the site's whole batch output uniformly:
  the distribution of the peers' list. Each injection's output is the
  batch's logits and its top-1 change per sample (``summarize``, inside the
  program). Timed: whole ``forward_campaign`` calls (set-up, key
  derivation, golden values, every chunk, the gather), warm (the first
  call compiles), best of ``rounds``.

  Returns:
    ``tool``, ``version``, ``versions``, ``seconds``, ``compile_s``,
    ``logits`` float32 [n, 64, 10], ``changed`` bool [n, 64], ``faults``
    (the list in the file's format: layer, sample, elem, bit; from the
    campaign's own records), ``modes``, ``replay_bitwise`` (of 20
    injections), ``single_bit`` (every record flips exactly one bit).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import peat_jax as peat  # pylint: disable=g-import-not-at-top

  fn, params, x = jax_model(data)
  found = [s.name for s in peat.discover_sites(fn, params, x)
           if s.kernel == "add"]
  assert tuple(found) == PEAT_SITES, found
  top1 = jnp.argmax(jax.jit(fn)(params, x), axis=1)

  def summarize(out):
    return out, jnp.argmax(out, axis=1) != top1

  def campaign():
    c = peat.forward_campaign(fn, (params, x), "bitflip",
                              key=jax.random.key(seed), n=n,
                              sites=PEAT_SITES, summarize=summarize, count=1)
    jax.block_until_ready(c.outputs)
    return c

  t0 = time.perf_counter()
  c = campaign()
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    c = campaign()
    times.append(time.perf_counter() - t0)
  logits, changed = (np.asarray(a) for a in c.outputs)
  idx = np.asarray(c.faults.index)[:, 0]
  xor = (np.asarray(c.faults.golden).view(np.uint32)
         ^ np.asarray(c.faults.value).view(np.uint32))[:, 0]
  single = bool(np.all((xor != 0) & ((xor & (xor - 1)) == 0)))
  layer = np.asarray(c.site_index, np.int32)
  per = np.asarray(campaign_data.LAYER_SIZES)[layer]
  faults = {"fault_layer": layer,
            "fault_sample": (idx // per).astype(np.int32),
            "fault_elem": (idx % per).astype(np.int32),
            "fault_bit": np.log2(np.maximum(xor, 1)).astype(np.int32)}
  probe = np.linspace(0, n - 1, 20).astype(int)
  replay_ok = sum(
      all(np.array_equal(np.asarray(a).view(np.uint8),
                         np.asarray(b)[i].view(np.uint8))
          for a, b in zip(c.replay(int(i)), c.outputs)) for i in probe)
  return {"tool": "peat.forward_campaign", "version": peat.__version__,
          "versions": {"jax": jax.__version__},
          "seconds": min(times), "all_seconds": times,
          "compile_s": compile_s, "logits": logits, "changed": changed,
          "faults": faults, "modes": dict(c.modes), "chunk": c.chunk,
          "replay_bitwise": f"{replay_ok}/{len(probe)}",
          "single_bit": single}


def write_faults(path, data, faults):
  """Puts peat's fault list into the campaign file (the one all tools
  read), keeping the file's NumPy-drawn list as ``numpy_fault_*``."""
  out = {k: v for k, v in data.items() if k != "meta"}
  for k in faults:
    if "numpy_" + k not in out:
      out["numpy_" + k] = data[k]
  out.update(faults)
  meta = dict(data["meta"], faults="peat.forward_campaign's records "
              "(numpy_fault_*: the NumPy-drawn list)")
  np.savez(path, meta=np.array(json.dumps(meta)), **out)


# ------------------------------------------------------------- helpers

def ensure_data(path, seed, n):
  """Loads the campaign file, writing it first when missing or different."""
  if os.path.exists(path):
    data = campaign_data.load(path)
    m = data["meta"]
    if (m.get("format"), m.get("seed"), m.get("n_faults")) == (
        campaign_data.FORMAT, seed, n):
      return data, False
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return campaign_data.make(path, seed=seed, n_faults=n), True


def run_torch_peers(args):
  """The torch runners in the peers' environment; returns (meta, arrays)."""
  if not args.no_ensure_env:
    subprocess.run(["bash", ENSURE], check=True)
  py = args.peers_python or PEERS_PY
  if not os.path.exists(py):
    sys.exit(f"no peers python at {py}: run `bash {ENSURE}`")
  out = os.path.splitext(args.data)[0] + "_torch_results.npz"
  cmd = [py, RUNNERS, "--data", args.data, "--out", out,
         "--rounds", str(args.rounds), "--warmup", str(args.warmup),
         "--threads", str(args.threads), "--tools", *args.tools]
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
  with np.load(out) as f:
    arrays = {k: f[k] for k in f.files}
  return json.loads(str(arrays.pop("meta"))), arrays


def bits_equal_rows(a, b):
  """Per injection: are the logits [64, 10] bitwise the same (n,) bool."""
  a = np.ascontiguousarray(a, np.float32).view(np.int32)
  b = np.ascontiguousarray(b, np.float32).view(np.int32)
  return (a == b).reshape(len(a), -1).all(1)


def reference_checks(data, golden, bare_logits):
  """NumPy reference vs torch: fault-free batch, and every faulted sample."""
  res = {}
  for dt in (np.float64, np.float32):
    ref = campaign_data.reference_forward(data, data["x"], dt)
    res[np.dtype(dt).name] = {
        "max_abs_diff": float(np.max(np.abs(ref - golden))),
        "top1_equal": int(np.sum(ref.argmax(1) == golden.argmax(1))),
    }
  if bare_logits is not None:
    x = data["x"]
    top1 = finite = same_nonfinite = 0
    worst = 0.0
    n = len(data["fault_layer"])
    for i in range(n):
      l, s, e, b = (int(data["fault_" + k][i])
                    for k in ("layer", "sample", "elem", "bit"))
      ref = campaign_data.reference_forward(data, x[s:s + 1], np.float64,
                                            fault=(l, 0, e, b))[0]
      with np.errstate(invalid="ignore"):  # signalling NaNs
        got = bare_logits[i, s].astype(np.float64)
      top1 += int(np.argmax(ref) == np.argmax(got))
      ok = np.isfinite(ref) & np.isfinite(got)
      same_nonfinite += int(np.array_equal(np.isfinite(ref), np.isfinite(got)))
      if ok.all():
        finite += 1
        worst = max(worst, float(np.max(np.abs(ref - got)
                                        / np.maximum(1.0, np.abs(got)))))
    res["faulted"] = {"n": n, "top1_equal": top1, "all_finite": finite,
                      "finite_pattern_equal": same_nonfinite,
                      "max_rel_diff_finite": worst}
  return res


def fault_report(data, p, bare):
  """The fault lists: peat's (which every tool ran) vs the NumPy-drawn one,
  and peat's outputs against the bare hook's, injection by injection."""
  n = len(p["faults"]["fault_layer"])
  print(f"fault list: peat.forward_campaign drew {n} faults (site uniform, "
        "then one element of the site's batch output and one of 32 bits "
        "uniform); written into the campaign file, every tool above injected"
        f" that list; every peat record flips exactly one bit: "
        f"{'yes' if p['single_bit'] else 'NO'}")
  fields = lambda b: np.bincount(np.where(b == 31, 0, np.where(b >= 23, 1, 2)),
                                 minlength=3)
  for label, pre in (("peat's list", "fault_"), ("NumPy's list", "numpy_fault_")):
    if pre + "layer" not in data:
      continue
    lay = np.bincount(data[pre + "layer"], minlength=3)
    f = fields(data[pre + "bit"])
    print(f"  {label:13s}: conv1/conv2/fc {lay[0]}/{lay[1]}/{lay[2]}, "
          f"sign/exponent/mantissa bits {f[0]}/{f[1]}/{f[2]} (expected "
          f"{n / 32:.0f}/{n / 4:.0f}/{23 * n / 32:.0f}), samples hit "
          f"{len(np.unique(data[pre + 'sample']))} of 64, mean element / "
          "layer size "
          f"{np.mean(data[pre + 'elem'] / np.asarray(campaign_data.LAYER_SIZES)[data[pre + 'layer']]):.3f}")
  print(f"  peat: modes {p['modes']}, chunk {p['chunk']}, first call "
        f"(tracing and compiling) {p['compile_s']:.1f} s, replay of 20 "
        f"injections bitwise: {p['replay_bitwise']}")
  if bare is not None:
    a, b = np.asarray(p["logits"], np.float64), bare["logits"].astype(
        np.float64)
    with np.errstate(all="ignore"):
      same_fin = (np.isfinite(a) == np.isfinite(b)).all(axis=(1, 2))
      fin = np.isfinite(a) & np.isfinite(b)
      rel = np.where(fin, np.abs(a - b) / np.maximum(1.0, np.abs(b)), 0.0)
    print(f"  peat vs bare hook, same faults: which logits are finite "
          f"{int(same_fin.sum())}/{n}, max |diff| / max(1, |torch|) over "
          f"finite logits {rel.max():.2e} (XLA's and torch's convolutions "
          "round differently)")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=1000, help="injections")
  ap.add_argument("--seed", type=int, default=0,
                  help="weights from seed, fault list from seed + 1")
  ap.add_argument("--data", default=os.path.join(ROOT, "runs", "fi_peers",
                                                 "campaign.npz"),
                  help="campaign file (written when missing)")
  ap.add_argument("--rounds", type=int, default=3,
                  help="timed passes over the list per tool; best counts")
  ap.add_argument("--warmup", type=int, default=50,
                  help="untimed injections per torch tool first")
  ap.add_argument("--threads", type=int, default=1,
                  help="torch.set_num_threads of the peers")
  ap.add_argument("--tools", nargs="+", default=["bare", "pytorchfi", "mrfi"],
                  choices=["bare", "pytorchfi", "mrfi"], help="torch peers")
  ap.add_argument("--no-peat", action="store_true", help="torch peers only")
  ap.add_argument("--peers-python", default=None,
                  help=f"python of the peers' environment ({PEERS_PY})")
  ap.add_argument("--no-ensure-env", action="store_true",
                  help="do not run scripts/ensure_peers_env.sh first")
  ap.add_argument("--peat-cores", type=int, default=1,
                  help="CPU cores this process (peat, XLA) and the peers may "
                  "use (sched_setaffinity; default 1, as the peers' one "
                  "torch thread; 0: all)")
  ap.add_argument("--json", default=None, help="also write the results here")
  args = ap.parse_args()
  if args.peat_cores > 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.peat_cores])

  t0 = time.perf_counter()
  data, made = ensure_data(args.data, args.seed, args.n)
  m = data["meta"]
  print(f"campaign {args.data} ({'written' if made else 'read'} "
        f"{time.perf_counter() - t0:.1f} s): {m['n_faults']} faults "
        f"(conv1/conv2/fc: {np.bincount(data['fault_layer'], minlength=3)}),"
        f" seed {m['seed']}; CNN trained {m['train']['steps']} SGD steps, "
        f"top-1 accuracy {m['accuracy_test_split']:.3f} on the 360 test "
        f"digits, {m['accuracy_batch']:.3f} on the batch of 64")

  load0 = os.getloadavg()
  peat_note, p = None, None
  if not args.no_peat:
    # peat first: its campaign draws the fault list, which goes into the
    # campaign file, so that every tool injects the same faults.
    p = run_peat(data, args.n, args.seed + 1, args.rounds)
    write_faults(args.data, data, p["faults"])
    data = campaign_data.load(args.data)
  else:
    peat_note = "peat: not run (--no-peat)"
  tmeta, arrays = run_torch_peers(args)
  n = tmeta["n_injections"]
  rows = []
  for key, t in tmeta["tools"].items():
    rows.append({"key": key, "tool": t["tool"],
                 "version": (tmeta["versions"]["torch"] if key == "bare"
                             else tmeta["versions"][key]),
                 "inj_per_s": t["inj_per_s"], "seconds": t["seconds"],
                 "logits": arrays["logits_" + key],
                 "changed": arrays["changed_" + key],
                 "golden_equal": t["golden_equal"]})
  tv = tmeta["versions"]
  versions = {"torch": tv["torch"], "pytorchfi": tv["pytorchfi"],
              "mrfi": tv["mrfi"], "numpy (peers)": tv["numpy"],
              "numpy (project)": np.__version__, "python": tv["python"]}
  if p is not None:
    versions.update(p["versions"])
    rows.append({"key": "peat", "tool": p["tool"], "version": p["version"],
                 "inj_per_s": n / p["seconds"], "seconds": p["all_seconds"],
                 "logits": np.asarray(p["logits"]),
                 "changed": np.asarray(p["changed"]), "golden_equal": None})
  load1 = os.getloadavg()

  by = {r["key"]: r for r in rows}
  bare = by.get("bare")
  ref = reference_checks(data, arrays["golden"],
                         bare["logits"] if bare else None)

  print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
  print(f"torch threads {tmeta['torch_threads']}; best of {tmeta['rounds']} "
        f"rounds of {n} injections after {tmeta['warmup']} warm-up; "
        f"loadavg {load0[0]:.2f} before, {load1[0]:.2f} after "
        f"({os.cpu_count()} cores, shared)")
  hdr = (f"{'tool':26s} {'version':>11s} {'inj/s':>9s} {'vs PyTorchFI':>13s} "
         f"{'vs bare':>8s} {'bitwise = bare':>15s} {'top-1 = bare':>13s} "
         f"{'top-1 chg':>9s}")
  print(hdr)
  print("-" * len(hdr))
  pfi = by.get("pytorchfi")
  for r in rows:
    eq = top = "-"
    if bare is not None:
      eq = f"{int(bits_equal_rows(r['logits'], bare['logits']).sum())}/{n}"
      top = f"{int((r['changed'] == bare['changed']).all(1).sum())}/{n}"
    vs_pfi = f"{r['inj_per_s'] / pfi['inj_per_s']:.2f}x" if pfi else "-"
    vs_bare = f"{r['inj_per_s'] / bare['inj_per_s']:.2f}x" if bare else "-"
    print(f"{r['tool'][:26]:26s} {r['version']:>11s} {r['inj_per_s']:9.0f} "
          f"{vs_pfi:>13s} {vs_bare:>8s} {eq:>15s} {top:>13s} "
          f"{int(r['changed'].any(1).sum()):9d}")
  if peat_note:
    print(peat_note)
  if "peat" in by and pfi and bare:
    sp, sb = (by["peat"]["inj_per_s"] / pfi["inj_per_s"],
              by["peat"]["inj_per_s"] / bare["inj_per_s"])
    print(f"goal >= 10x PyTorchFI: {sp:.1f}x {'met' if sp >= 10 else 'NOT met'}"
          f"; >= 3x bare hook: {sb:.1f}x {'met' if sb >= 3 else 'NOT met'}")
  bad = [r["tool"] for r in rows if r["golden_equal"] is False]
  if bad:
    print(f"WARNING: fault-free logits differ from a plain torch forward: {bad}")
  f64, f32 = ref["float64"], ref["float32"]
  print(f"NumPy reference vs torch, fault-free batch: float64 max |diff| "
        f"{f64['max_abs_diff']:.2e} (top-1 {f64['top1_equal']}/64), float32 "
        f"{f32['max_abs_diff']:.2e} (top-1 {f32['top1_equal']}/64)")
  if "faulted" in ref:
    fr = ref["faulted"]
    print(f"NumPy float64 reference vs bare hook, faulted sample of each "
          f"injection: top-1 {fr['top1_equal']}/{fr['n']}, which logits are "
          f"finite {fr['finite_pattern_equal']}/{fr['n']}, all finite in both "
          f"{fr['all_finite']}/{fr['n']}, max |diff| / max(1, |torch|) there "
          f"{fr['max_rel_diff_finite']:.2e}")

  if p is not None:
    fault_report(data, p, bare)

  if args.json:
    out = {"versions": versions, "torch": tmeta, "reference": ref,
           "loadavg_before": load0, "loadavg_after": load1,
           "rows": [{k: v for k, v in r.items()
                     if k not in ("logits", "changed")} for r in rows]}
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
