"""The shared campaign of bench_fi_peers: CNN weights, batch, fault list.

NumPy and scikit-learn only, so both the project's environment and the
peers' environment can read it (it never imports peat_jax or torch).

The model (torch layout, NCHW, float32)::

  conv1: Conv2d(1, 16, 3, padding=1)   -> ReLU
  conv2: Conv2d(16, 32, 3, padding=1)  -> ReLU
  flatten (C, H, W order: 32 * 8 * 8 = 2048)
  fc:    Linear(2048, 10)               -> logits

Faults go into the *outputs of the layers* conv1, conv2 and fc (before the
ReLU), as a forward hook on those modules sees them.

The data file (``.npz``) holds:

* ``conv1_w`` [16,1,3,3], ``conv1_b`` [16], ``conv2_w`` [32,16,3,3],
  ``conv2_b`` [32], ``fc_w`` [10,2048], ``fc_b`` [10]: float32, trained here
  (see :func:`train`), deterministic given the seed;
* ``x`` [64,1,8,8] float32 and ``y`` [64] int32: the first 64 images of the
  project's digits test split (models/data.py's rule, re-implemented here:
  pixels / 16, permutation ``default_rng(20260101)``, first 360 = test);
* the fault list, ``N`` faults as parallel arrays: ``fault_layer`` (0 conv1,
  1 conv2, 2 fc), ``fault_sample`` (index in the batch), ``fault_elem`` (flat
  index in that sample's layer output in torch's C, H, W order: conv
  ``c * 64 + h * 8 + w``, fc the logit index) and ``fault_bit`` (0..31 of the
  float32, 0 = least significant mantissa bit, 31 = sign); drawn with
  ``numpy.random.default_rng(seed + 1)`` as four vectors in that order: layer
  uniform over the 3 layers, sample uniform over 64, element uniform over the
  layer's per-sample size, bit uniform over 32;
* ``meta``: a JSON string with the seed, the training recipe and accuracies.

The weights come from :func:`train` with ``default_rng(seed)`` (He init, then
the minibatch indices), in NumPy float64: the same seed gives the same file
(bitwise on one machine; another BLAS may round the float64 sums otherwise).

A JAX model in NHWC layout maps ``fault_elem`` of a conv layer with
``np.unravel_index(elem, (C, 8, 8))`` -> (c, h, w) -> its [h, w, c], and
takes the fc weight as ``fc_w`` with its 2048 inputs in (C, H, W) order.
"""

import json

import numpy as np

FORMAT = 1
LAYERS = ("conv1", "conv2", "fc")
# Elements of one sample's output of each layer.
LAYER_SIZES = (16 * 8 * 8, 32 * 8 * 8, 10)
LAYER_SHAPES = ((16, 8, 8), (32, 8, 8), (10,))
BATCH = 64
DIGITS_SPLIT_SEED = 20260101  # models/data.py
DIGITS_TEST_SIZE = 360  # models/data.py


def digits_splits():
  """(x_train, y_train, x_test, y_test); x NCHW float32 in [0, 1]."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  d = datasets.load_digits()
  x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]
  y = d.target.astype(np.int32)
  perm = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y))
  te, tr = perm[:DIGITS_TEST_SIZE], perm[DIGITS_TEST_SIZE:]
  return x[tr], y[tr], x[te], y[te]


# ---------------------------------------------------------------- forward

def _im2col(x):
  """[N,C,H,W] -> [N*H*W, C*9]: the 3x3 windows of the zero-padded input."""
  n, c, h, w = x.shape
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
  return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _col_out(z, n):
  """[N*H*W, O] -> [N, O, H, W] (8x8 maps)."""
  return z.reshape(n, 8, 8, -1).transpose(0, 3, 1, 2)


def conv3x3(x, w, b):
  """Cross-correlation like torch's Conv2d(k=3, padding=1), NCHW."""
  return _col_out(_im2col(x) @ w.reshape(len(w), -1).T + b, len(x))


def flip_bit(values, idx, bit):
  """Copy of float32 ``values`` with bit ``bit`` of flat element ``idx`` flipped."""
  v = np.array(values, np.float32, copy=True, order="C")
  flat = v.reshape(-1).view(np.int32)  # a view: v is C-contiguous
  flat[idx] ^= np.int32(np.uint32(1 << bit).view(np.int32))
  return v


def reference_forward(params, x, dtype=np.float64, fault=None):
  """NumPy forward of the CNN; returns the logits [N, 10] in ``dtype``.

  ``fault``: optional (layer, sample, elem, bit); the layer's output is cast
  to float32 (what torch computes in), the bit flipped there, and the
  computation goes on in ``dtype``. ``sample`` indexes ``x``'s batch.
  """
  p = {k: np.asarray(params[k], dtype) for k in
       ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc_w", "fc_b")}
  x = np.asarray(x, dtype)

  def maybe_fault(layer, out):
    if fault is None or fault[0] != layer:
      return out
    _, s, e, bit = fault
    out = np.array(out, np.float32, order="C")
    out[s] = flip_bit(out[s], e, bit)
    return out.astype(dtype)

  with np.errstate(all="ignore"):  # a flipped exponent bit may give inf/nan
    h = np.maximum(maybe_fault(0, conv3x3(x, p["conv1_w"], p["conv1_b"])), 0)
    h = np.maximum(maybe_fault(1, conv3x3(h, p["conv2_w"], p["conv2_b"])), 0)
    return maybe_fault(2, h.reshape(len(h), -1) @ p["fc_w"].T + p["fc_b"])


# ---------------------------------------------------------------- training

def _init(rng):
  def he(shape, fan_in):
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)

  return {
      "conv1_w": he((16, 1, 3, 3), 9), "conv1_b": np.zeros(16),
      "conv2_w": he((32, 16, 3, 3), 144), "conv2_b": np.zeros(32),
      "fc_w": he((10, 2048), 2048) * 0.5, "fc_b": np.zeros(10),
  }


def _loss_grads(p, x, y):
  """Mean softmax cross-entropy and its gradients (float64)."""
  n = len(x)
  c1 = _im2col(x)
  w1 = p["conv1_w"].reshape(16, -1)
  z1 = c1 @ w1.T + p["conv1_b"]  # [N*64, 16], rows (n, h, w)
  a1 = np.maximum(z1, 0)
  c2 = _im2col(_col_out(a1, n))
  w2 = p["conv2_w"].reshape(32, -1)
  z2 = c2 @ w2.T + p["conv2_b"]  # [N*64, 32]
  a2 = np.maximum(z2, 0)
  f = _col_out(a2, n).reshape(n, -1)  # torch's flatten: (C, H, W)
  logits = f @ p["fc_w"].T + p["fc_b"]
  logits -= logits.max(1, keepdims=True)
  prob = np.exp(logits)
  prob /= prob.sum(1, keepdims=True)
  loss = -np.mean(np.log(prob[np.arange(n), y] + 1e-30))
  d = prob
  d[np.arange(n), y] -= 1
  d /= n
  g = {"fc_w": d.T @ f, "fc_b": d.sum(0)}
  dz2 = (d @ p["fc_w"]).reshape(n, 32, 8, 8).transpose(0, 2, 3, 1)
  dz2 = dz2.reshape(n * 64, 32) * (z2 > 0)
  g["conv2_w"] = (dz2.T @ c2).reshape(p["conv2_w"].shape)
  g["conv2_b"] = dz2.sum(0)
  dc2 = (dz2 @ w2).reshape(n, 8, 8, 16, 3, 3)  # col2im of the windows
  da1 = np.zeros((n, 10, 10, 16))
  for i in range(3):
    for j in range(3):
      da1[:, i:i + 8, j:j + 8, :] += dc2[..., i, j]
  dz1 = da1[:, 1:9, 1:9, :].reshape(n * 64, 16) * (z1 > 0)
  g["conv1_w"] = (dz1.T @ c1).reshape(p["conv1_w"].shape)
  g["conv1_b"] = dz1.sum(0)
  return loss, g


def train(x, y, seed, steps=300, batch=64, lr=0.05, momentum=0.9):
  """Minibatch SGD with momentum in float64; returns float32 params, loss."""
  rng = np.random.default_rng(seed)
  p = _init(rng)
  v = {k: np.zeros_like(a) for k, a in p.items()}
  x = x.astype(np.float64)
  loss = float("nan")
  for _ in range(steps):
    idx = rng.integers(0, len(y), batch)
    loss, g = _loss_grads(p, x[idx], y[idx])
    for k in p:
      v[k] = momentum * v[k] - lr * g[k]
      p[k] += v[k]
  return {k: a.astype(np.float32) for k, a in p.items()}, float(loss)


# ---------------------------------------------------------------- faults

def fault_list(seed, n):
  """The n faults: dict of int32 arrays layer, sample, elem, bit."""
  rng = np.random.default_rng(seed)
  layer = rng.integers(0, len(LAYERS), n)
  sample = rng.integers(0, BATCH, n)
  elem = rng.integers(0, np.asarray(LAYER_SIZES)[layer])
  bit = rng.integers(0, 32, n)
  return {"fault_layer": layer.astype(np.int32),
          "fault_sample": sample.astype(np.int32),
          "fault_elem": elem.astype(np.int32),
          "fault_bit": bit.astype(np.int32)}


def make(path, seed=0, n_faults=1000, steps=300):
  """Trains the CNN, draws the faults and writes the data file; returns it."""
  x_tr, y_tr, x_te, y_te = digits_splits()
  params, loss = train(x_tr, y_tr, seed, steps=steps)
  acc_test = float(np.mean(
      reference_forward(params, x_te, np.float32).argmax(1) == y_te))
  x, y = x_te[:BATCH], y_te[:BATCH]
  acc_batch = float(np.mean(
      reference_forward(params, x, np.float32).argmax(1) == y))
  meta = {"format": FORMAT, "seed": seed, "n_faults": n_faults,
          "train": {"steps": steps, "batch": 64, "lr": 0.05, "momentum": 0.9,
                    "optimizer": "SGD+momentum, float64 NumPy, He init",
                    "train_images": int(len(y_tr)), "final_loss": loss},
          "accuracy_test_split": acc_test, "accuracy_batch": acc_batch,
          "batch": f"first {BATCH} images of the digits test split"}
  data = dict(params, x=np.ascontiguousarray(x), y=y,
              **fault_list(seed + 1, n_faults), meta=np.array(json.dumps(meta)))
  np.savez(path, **data)
  return load(path)


def load(path):
  """The data file as a dict of arrays, ``meta`` decoded."""
  with np.load(path) as f:
    data = {k: f[k] for k in f.files}
  data["meta"] = json.loads(str(data["meta"]))
  return data
