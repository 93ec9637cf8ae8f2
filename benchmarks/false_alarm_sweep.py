"""False-alarm sweep: KUTs that only reorder sums, played back in training.

Usage::

  python benchmarks/false_alarm_sweep.py [--scenarios=cnn,vit,gpt] \
      [--workdir=/tmp/peat_sweep] [--steps=60] [--checkpoint_every=20] \
      [--torch] [--backward=golden|kut] [--kuts=spec,spec]

  # the bf16 scenarios, torch kernels too, forward and backward
  python benchmarks/false_alarm_sweep.py --scenarios=llama,vit_bf16 \
      --torch --backward=kut

The calibration suite (``tools/calibrate.py``) checks the Detector on
forward site inputs captured once per model. This sweep checks it where a
user meets it: playback FI at every saved checkpoint of a short golden run
of each scenario, every site of the kernel (forward records), with the
native variants whose only difference from the golden kernel is the order
or fusion of their float32 operations (``EXPECTED_ERROR_MODEL`` says
``reordering``) and the benign JAX ports (a split-K matmul whose partial
last column tile sums its K terms in two halves). Every record should be ``exact`` or ``reordering``; a
``warn`` is allowed (the KUT is more than 2x as far from float64 as the
golden kernel, which the verdict rules call a warning), a fault model or
``fail`` is a false alarm. ``--torch`` adds the bridge's built-in torch
kernels (third-party implementations: ``F.rms_norm``, ``F.silu``, a torch
rope, SDPA, ...); ``--backward=kut`` plays each KUT's own VJP at the
backward sites too. A KUT a site refuses (a torch kernel of one dtype at a
bf16 site with float32 parameters) is listed as refused. Prints one line
per (scenario, KUT) and every record that does not pass, the paths that
decided the records (the triage screen, the decomposition, the port probe
run whole or carried), then the totals; exits 1 on a false alarm.
"""

import collections
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging

import peat_jax as peat
from peat_jax import models
from peat_jax.kernels import native
from peat_jax.kernels import ports
from peat_jax.kernels import EXPECTED_ERROR_MODEL

_SCENARIOS = flags.DEFINE_list("scenarios", ["cnn", "vit", "gpt"],
                               "Training scenarios (peat_jax.models).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_sweep",
                               "Golden runs and playback records go here.")
_STEPS = flags.DEFINE_integer("steps", 60, "Golden steps per scenario.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 20,
                              "Golden checkpoint interval.")
_TORCH = flags.DEFINE_bool("torch", False, "Also the bridge's torch kernels.")
_BACKWARD = flags.DEFINE_enum("backward", "golden", ["golden", "kut"],
                              "The KUT's VJP at backward sites too (kut).")
_KUTS = flags.DEFINE_list(
    "kuts", None, "Only these KUT specs of the sweep's list (default: all).")

KERNELS = ("matmul", "conv2d", "softmax", "layer_norm", "rms_norm", "silu",
           "rope")
#: The bridge's torch kernels of another implementation of the same math.
TORCH_KUTS = ("torch:matmul", "torch:conv2d", "torch:softmax",
              "torch:layer_norm", "torch:rms_norm", "torch:silu",
              "torch:rope", "torch:attention", "torch:gelu")
BENIGN = ("exact", "reordering")


for _name, (_kernel, _fn) in ports.BENIGN_PORTS.items():
  peat.register_kut(f"port:{_name}", _fn, kernel=_kernel)


def reordering_kuts() -> list[str]:
  """Native KUT specs whose expected error model is ``reordering``, and
  the benign JAX ports (``peat_jax.kernels.ports.BENIGN_PORTS``)."""
  return [f"native:{k}:{v}" for k in KERNELS for v in native.variants(k)
          if EXPECTED_ERROR_MODEL.get(k, {}).get(v) == "reordering"] + [
              f"port:{name}" for name in ports.BENIGN_PORTS]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  kuts = reordering_kuts()
  if _TORCH.value:
    import peat_jax.bridges  # noqa: F401  pylint: disable=g-import-not-at-top
    kuts += list(TORCH_KUTS)
  if _KUTS.value:
    unknown = sorted(set(_KUTS.value) - set(kuts))
    if unknown:
      print(f"--kuts {unknown} are not in the sweep's list: {kuts}")
      sys.exit(2)
    kuts = [k for k in kuts if k in _KUTS.value]
  print(f"KUTs: {', '.join(kuts)}")
  false_alarms, total = 0, collections.Counter()
  paths = collections.Counter()
  t_all = time.time()
  for scen in _SCENARIOS.value:
    task = models.get_task(scen)
    golden = os.path.join(_WORKDIR.value, scen, "golden")
    t0 = time.time()
    peat.golden_train(task, golden, steps=_STEPS.value,
                      checkpoint_every=_EVERY.value, evaluate=False)
    print(f"{scen}: golden run ({_STEPS.value} steps) {time.time() - t0:.0f} s")
    for kut in kuts:
      t0 = time.time()
      try:
        pb = peat.playback(task, golden, kut, campaign_dir=os.path.join(
            _WORKDIR.value, scen, kut.replace(":", "_") + (
                "_bwd" if _BACKWARD.value == "kut" else "")),
                           backward=_BACKWARD.value)
      except peat.PeatError as e:
        if "no site of kernel" in str(e) or "no site" in str(e):
          continue  # the model has no call of this kernel
        if any(w in str(e) for w in ("share one dtype", "backward",
                                     "preferred_element_type")):
          print(f"  {kut}: refused: {str(e)[:160]}")
          continue
        raise
      seen = collections.Counter(
          (r["diagnosis"]["model"], r["diagnosis"]["verdict"])
          for r in pb.records)
      total.update(seen)
      paths.update(r.get("decided_by", "(not recorded)") for r in pb.records)
      print(f"  {kut}: {len(pb.records)} records, "
            + ", ".join(f"{m} {v} x{n}" for (m, v), n in sorted(seen.items()))
            + f" ({time.time() - t0:.0f} s)")
      for r in pb.records:
        d = r["diagnosis"]
        if d["verdict"] == "pass":
          continue
        bad = d["model"] not in BENIGN or d["verdict"] == "fail"
        false_alarms += bad
        print(f"    {'FALSE ALARM ' if bad else ''}{d['verdict']} "
              f"{d['model']} step {r['step']} {r['site']}: {d['evidence']}")
  print("decided by: " + ", ".join(f"{k} x{n}"
                                    for k, n in sorted(paths.items())))
  print(f"{sum(total.values())} records: "
        + ", ".join(f"{m} {v} x{n}" for (m, v), n in sorted(total.items()))
        + f"; false alarms {false_alarms}; {time.time() - t_all:.0f} s")
  sys.exit(1 if false_alarms else 0)


if __name__ == "__main__":
  app.run(main)
