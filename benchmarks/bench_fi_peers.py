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

def run_peat(data) -> dict:
  """THE PEAT SIDE -- lead engineer: ``peat.forward_campaign`` goes here.

  Args:
    data: the campaign, :func:`campaign_data.load`'s dict: ``conv1_w``
      [16,1,3,3], ``conv1_b``, ``conv2_w`` [32,16,3,3], ``conv2_b``, ``fc_w``
      [10,2048] (inputs in C,H,W order), ``fc_b`` (float32, torch layout);
      ``x`` [64,1,8,8] float32 NCHW, ``y`` [64]; the fault list
      ``fault_layer`` (0 conv1, 1 conv2, 2 fc: the layer's output, before
      the ReLU), ``fault_sample``, ``fault_elem`` (flat C,H,W index within
      the sample's layer output), ``fault_bit`` (0..31 of the float32);
      ``meta``. ``campaign_data.reference_forward`` is the NumPy model.

  Returns:
    ``tool`` (str), ``version`` (str), ``versions`` (dict, e.g. jax's),
    ``seconds`` (wall time of the whole campaign, warm: compile excluded,
    best of the rounds), ``logits`` float32 [N, 64, 10] (the batch's logits
    of each injection, in list order), ``changed`` bool [N, 64] (top-1
    differs from the fault-free forward); optional ``compile_s``.
  """
  del data
  raise NotImplementedError("peat.forward_campaign: lead engineer")


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
  ap.add_argument("--json", default=None, help="also write the results here")
  args = ap.parse_args()

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

  peat_note = None
  tv = tmeta["versions"]
  versions = {"torch": tv["torch"], "pytorchfi": tv["pytorchfi"],
              "mrfi": tv["mrfi"], "numpy (peers)": tv["numpy"],
              "numpy (project)": np.__version__, "python": tv["python"]}
  if not args.no_peat:
    try:
      p = run_peat(data)
    except NotImplementedError as e:
      peat_note = f"peat: not run ({e})"
    else:
      versions.update(p.get("versions", {}))
      rows.append({"key": "peat", "tool": p["tool"], "version": p["version"],
                   "inj_per_s": n / p["seconds"], "seconds": [p["seconds"]],
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

  if args.json:
    out = {"versions": versions, "torch": tmeta, "reference": ref,
           "loadavg_before": load0, "loadavg_after": load1,
           "rows": [{k: v for k, v in r.items()
                     if k not in ("logits", "changed")} for r in rows]}
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
