"""Torch side of bench_fi_peers: one campaign through three torch injectors.

Runs in the peers' environment (``scripts/ensure_peers_env.sh``: torch CPU,
PyTorchFI 0.6.0, MRFI 2.1.0), never in the project's; bench_fi_peers.py
starts it as a subprocess. It reads the campaign file written by
``campaign_data.make`` (CNN weights, batch of 64 digits, fault list) and, for
each tool, does the list's injections one by one: each is one whole forward
pass of the batch with one bit flipped in the output of one layer (conv1,
conv2 or fc, before the ReLU) at one (sample, element); per injection it keeps
the batch's logits [64, 10] and per sample whether top-1 differs from the
fault-free forward.

How each tool injects (every one flips exactly the listed bit):

* ``bare``: ``register_forward_hook`` on conv1, conv2 and fc, once; the hook
  of the faulted layer XORs the bit into the output through an int32 view
  (``output.view(-1).view(torch.int32)[k] ^= mask``).
* ``pytorchfi``: a ``pytorchfi.core.fault_injection`` subclass over
  ``layer_types=[nn.Conv2d, nn.Linear]`` (layers 0, 1, 2) whose method
  ``flip_bit`` is passed as ``declare_neuron_fi(function=...)`` with
  ``layer_num/batch/dim1/dim2/dim3`` of the fault (dim2/dim3 None for fc), as
  PyTorchFI's own ``single_bit_flip_func`` does, the bit kept on the
  subclass. Per injection: ``declare_neuron_fi`` (it deep-copies the model
  and hooks the copy: that is its API) and a forward of the returned
  corrupted model.
* ``mrfi``: ``MRFI(model, EasyConfig)`` with one ``activation_out`` injector
  on modules conv1, conv2, fc: selector ``FixPosition`` (flat index into the
  layer's whole output, ``sample * size + element``) and error mode
  ``FloatFixedBitFlip`` (``bit``, float32); all disabled. Per injection,
  through the config nodes from ``get_activation_configs`` (fetched once):
  ``enabled`` on for the faulted layer only, selector ``position`` and error
  mode ``bit`` set, then a forward. That is MRFI's exact fault, not a
  statistical stand-in: same (layer, sample, element, bit).

Each tool's fault format is made from the shared list before timing; the
timed loop is the 1,000 (fault -> forward -> record) iterations after a
warm-up, best of ``--rounds`` rounds, tools back to back in each round.
torch runs on ``--threads`` threads, 1 by default: on this project's 2 cores,
shared with other work, two OpenMP threads stall at each barrier whenever one
of them is preempted (measured: 10 forwards/s with 2 threads vs 1,250 with 1
under load 4).

Usage (bench_fi_peers.py does this):
  benchmarks/fi_peers/.venv/bin/python benchmarks/fi_peers/torch_runners.py \\
      --data runs/fi_peers/campaign.npz --out runs/fi_peers/torch_results.npz
"""

import argparse
from importlib.metadata import version
import json
import os
import platform
import time

import numpy as np
import torch
from torch import nn

LAYERS = ("conv1", "conv2", "fc")
LAYER_SHAPES = ((16, 8, 8), (32, 8, 8), (10,))
LAYER_SIZES = tuple(int(np.prod(s)) for s in LAYER_SHAPES)


class CNN(nn.Module):
  """conv 1->16 3x3 (same), ReLU, conv 16->32 3x3 (same), ReLU, fc 2048->10."""

  def __init__(self, data):
    super().__init__()
    self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
    self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
    self.fc = nn.Linear(2048, 10)
    with torch.no_grad():
      for name in LAYERS:
        mod = getattr(self, name)
        mod.weight.copy_(torch.from_numpy(data[name + "_w"]))
        mod.bias.copy_(torch.from_numpy(data[name + "_b"]))
    self.eval()

  def forward(self, x):
    h = torch.relu(self.conv1(x))
    h = torch.relu(self.conv2(h))
    return self.fc(h.flatten(1))


def _mask(bit):
  """The int32 XOR mask of float32 bit ``bit`` (bit 31 is the sign)."""
  return -(1 << 31) if bit == 31 else 1 << bit


class Recorder:
  """Per injection: the logits [64, 10] and top-1 changed per sample [64]."""

  def __init__(self, n, golden):
    self.logits = torch.empty((n,) + tuple(golden.shape), dtype=golden.dtype)
    self.changed = torch.empty((n, golden.shape[0]), dtype=torch.bool)
    self.golden_top1 = golden.argmax(1)

  def record(self, i, out):
    self.logits[i].copy_(out)
    torch.ne(out.argmax(1), self.golden_top1, out=self.changed[i])


class BareHook:
  key, tool = "bare", "bare torch forward hook"

  def __init__(self, data, faults):
    self.model = CNN(data)
    self.target = None  # (layer, flat index in the batch's output, mask)
    for li, name in enumerate(LAYERS):
      getattr(self.model, name).register_forward_hook(self._hook(li))
    self.faults = [(l, s * LAYER_SIZES[l] + e, _mask(b))
                   for l, s, e, b in faults]

  def _hook(self, li):
    def hook(module, inputs, output):
      del module, inputs
      t = self.target
      if t is not None and t[0] == li:
        output.view(-1).view(torch.int32)[t[1]] ^= t[2]
    return hook

  def golden(self, x):
    with torch.no_grad():
      return self.model(x)

  def run(self, x, rec, idx):
    with torch.no_grad():
      for i in idx:
        self.target = self.faults[i]
        rec.record(i, self.model(x))
    self.target = None


class PyTorchFI:
  key, tool = "pytorchfi", "PyTorchFI"

  def __init__(self, data, faults):
    from pytorchfi import core  # pylint: disable=g-import-not-at-top

    class BitFlipFI(core.fault_injection):
      """Neuron fault: flip bit ``corrupt_bit[i]`` of each declared neuron."""

      def __init__(self, model, batch_size, input_shape):
        super().__init__(model, batch_size, input_shape=input_shape,
                         layer_types=[nn.Conv2d, nn.Linear], use_cuda=False)
        self.corrupt_bit = []

      def flip_bit(self, module, input_val, output):
        del module, input_val
        layer = self.get_current_layer()
        for i, l in enumerate(self.corrupt_layer):
          if l != layer:
            continue
          if self.get_layer_dim(layer) == 4:
            idx = (self.corrupt_batch[i], self.corrupt_dim1[i],
                   self.corrupt_dim2[i], self.corrupt_dim3[i])
          else:
            idx = (self.corrupt_batch[i], self.corrupt_dim1[i])
          output[idx].view(torch.int32).bitwise_xor_(_mask(self.corrupt_bit[i]))
        self.updateLayer()
        if self.get_current_layer() >= self.get_total_layers():
          self.reset_current_layer()

    self.model = CNN(data)
    self.pfi = BitFlipFI(self.model, int(data["x"].shape[0]),
                         list(data["x"].shape[1:]))
    self.faults = []
    for l, s, e, b in faults:
      coords = [int(c) for c in np.unravel_index(e, LAYER_SHAPES[l])]
      c, h, w = coords + [None] * (3 - len(coords))
      self.faults.append((dict(layer_num=[l], batch=[s], dim1=[c], dim2=[h],
                               dim3=[w]), [b]))

  def golden(self, x):
    with torch.no_grad():
      return self.pfi.get_original_model()(x)

  def run(self, x, rec, idx):
    pfi = self.pfi
    with torch.no_grad():
      for i in idx:
        where, bits = self.faults[i]
        corrupted = pfi.declare_neuron_fi(function=pfi.flip_bit, **where)
        pfi.corrupt_bit = bits
        rec.record(i, corrupted(x))


MRFI_CONFIG = """
faultinject:
  - type: activation_out
    enabled: False
    selector:
      method: FixPosition
      position: 0
    error_mode:
      method: FloatFixedBitFlip
      bit: 0
      floattype: float32
    module_fullname: [conv1, conv2, fc]
"""


class Mrfi:
  key, tool = "mrfi", "MRFI"

  def __init__(self, data, faults):
    import mrfi  # pylint: disable=g-import-not-at-top

    self.model = mrfi.MRFI(CNN(data), mrfi.EasyConfig.load_string(MRFI_CONFIG))
    get = self.model.get_activation_configs
    self.enabled = [get(is_out=True, module_fullname=n) for n in LAYERS]
    self.selector = [get("selector.args", is_out=True, module_fullname=n)
                     for n in LAYERS]
    self.error_mode = [get("error_mode.args", is_out=True, module_fullname=n)
                       for n in LAYERS]
    assert all(len(c) == 1 for c in self.enabled + self.selector
               + self.error_mode), "one config node per layer expected"
    self.faults = [(l, s * LAYER_SIZES[l] + e, b) for l, s, e, b in faults]

  def golden(self, x):
    with self.model.golden_run():
      return self.model(x)

  def run(self, x, rec, idx):
    prev = None
    for i in idx:
      l, pos, bit = self.faults[i]
      if prev != l:
        if prev is not None:
          self.enabled[prev].enabled = False
        self.enabled[l].enabled = True
        prev = l
      self.selector[l].position = pos
      self.error_mode[l].bit = bit
      rec.record(i, self.model(x))  # MRFI.__call__ runs under no_grad
    if prev is not None:
      self.enabled[prev].enabled = False


RUNNERS = {r.key: r for r in (BareHook, PyTorchFI, Mrfi)}


def _bits_equal(a, b):
  return np.array_equal(np.asarray(a).view(np.int32), np.asarray(b).view(np.int32))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--data", required=True, help="campaign .npz")
  ap.add_argument("--out", required=True, help="results .npz (+ .json)")
  ap.add_argument("--tools", nargs="+", default=list(RUNNERS),
                  choices=list(RUNNERS))
  ap.add_argument("--rounds", type=int, default=3,
                  help="timed passes over the list per tool (best counts)")
  ap.add_argument("--warmup", type=int, default=50,
                  help="untimed injections per tool first")
  ap.add_argument("--threads", type=int, default=1,
                  help="torch.set_num_threads (see the module doc)")
  args = ap.parse_args()

  torch.set_num_threads(args.threads)
  with np.load(args.data) as f:
    data = {k: f[k] for k in f.files}
  faults = list(zip(*(data["fault_" + k].tolist()
                      for k in ("layer", "sample", "elem", "bit"))))
  n = len(faults)
  x = torch.from_numpy(data["x"])
  runners = [RUNNERS[k](data, faults) for k in args.tools]

  golden = CNN(data)(x).detach()
  goldens_equal = {}
  for r in runners:
    goldens_equal[r.key] = _bits_equal(r.golden(x).numpy(), golden.numpy())

  recs = {r.key: Recorder(n, golden) for r in runners}
  w = min(args.warmup, n)
  warm = {r.key: Recorder(w, golden) for r in runners}
  for r in runners:
    r.run(x, warm[r.key], range(w))
  times = {r.key: [] for r in runners}
  load_before = os.getloadavg()
  for _ in range(args.rounds):
    for r in runners:
      t = time.perf_counter()
      r.run(x, recs[r.key], range(n))
      times[r.key].append(time.perf_counter() - t)
  load_after = os.getloadavg()

  # The last round's records are kept; the warm-up's must equal them (the
  # same injection gives the same bits every time).
  warmup_equal = {r.key: _bits_equal(warm[r.key].logits.numpy(),
                                     recs[r.key].logits[:w].numpy())
                  for r in runners}
  meta = {
      "n_injections": n, "rounds": args.rounds, "warmup": args.warmup,
      "torch_threads": torch.get_num_threads(),
      "tools": {r.key: {"tool": r.tool, "seconds": times[r.key],
                        "best_s": min(times[r.key]),
                        "inj_per_s": n / min(times[r.key]),
                        "golden_equal": bool(goldens_equal[r.key])}
                for r in runners},
      "versions": {"python": platform.python_version(),
                   "torch": torch.__version__,
                   "pytorchfi": version("pytorchfi"),
                   "mrfi": version("mrfi"),
                   "numpy": np.__version__},
      "loadavg_before": load_before, "loadavg_after": load_after,
      "warmup_equal": warmup_equal,
  }
  arrays = {"golden": golden.numpy()}
  for r in runners:
    arrays["logits_" + r.key] = recs[r.key].logits.numpy()
    arrays["changed_" + r.key] = recs[r.key].changed.numpy()
  np.savez(args.out, meta=np.array(json.dumps(meta)), **arrays)
  print(json.dumps(meta))


if __name__ == "__main__":
  main()
