"""Every documented KUT signature, called at real sites of every kernel.

For each site kernel, a KUT is written with exactly the signature
docs/kernels.md documents (``peat.kernels.signature``: the names, kinds
and defaults on the page, no ``**kwargs``) and substituted at the forward
sites of that kernel in real training steps: the float32 and bf16 stock
models of docs/examples, the reference GPT, Llama, CNN and bf16 ViT, and a
model with attention pooling over tokens and a log-softmax loss. Each call
must bind to the signature, pass every argument the page says is passed
at every call, and give each argument in the form the page states
(``peat.kernels.check_call``); the KUT computes as the page says a port
should (defaults included: attention's scale 1/sqrt(head_dim) when the
model passes none) and returns what the golden kernel returns, or the
substitution refuses it. Steps are traced abstractly (``jax.eval_shape``),
twice per task: nothing compiles.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

import peat_jax as peat
from peat_jax import models
from peat_jax.kernels import _conventions
from peat_jax.kernels import _user

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "examples")


# ---------------------------------------------- ports written to the page


def _f32(x):
  return x.astype(jnp.float32)


def dot_general(lhs, rhs, *, dimension_numbers, precision,
                preferred_element_type, out_sharding):
  del out_sharding  # one device
  return lax.dot_general(lhs, rhs, dimension_numbers, precision,
                         preferred_element_type=preferred_element_type)


def conv_general_dilated(lhs, rhs, *, window_strides, padding, lhs_dilation,
                         rhs_dilation, dimension_numbers, feature_group_count,
                         batch_group_count, precision, preferred_element_type,
                         out_sharding):
  del out_sharding
  return lax.conv_general_dilated(
      lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
      dimension_numbers, feature_group_count, batch_group_count, precision,
      preferred_element_type)


def softmax(x, *, axis=-1):
  return jax.nn.softmax(_f32(x), axis=axis).astype(x.dtype)


def log_softmax(x, *, axis=-1):
  return jax.nn.log_softmax(_f32(x), axis=axis).astype(x.dtype)


def layer_norm(x, scale, bias, eps):
  xf = _f32(x)
  m = xf.mean(-1, keepdims=True)
  y = (xf - m) * lax.rsqrt(jnp.square(xf - m).mean(-1, keepdims=True) + eps)
  y = y if scale is None else y * scale
  return (y if bias is None else y + bias).astype(x.dtype)


def rms_norm(x, scale, eps):
  xf = _f32(x)
  y = xf * lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + eps)
  return (y if scale is None else y * scale).astype(x.dtype)


def attention(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False):
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
  s = jnp.einsum("bthd,bshd->bhts", _f32(q), _f32(k)) * scale
  if bias is not None:
    s = s + bias
  keep = jnp.ones(s.shape, bool)
  if mask is not None:
    keep = keep & mask
  if is_causal:
    keep = keep & jnp.tril(jnp.ones(s.shape[-2:], bool))
  p = jax.nn.softmax(jnp.where(keep, s, -jnp.inf), axis=-1)
  return jnp.einsum("bhts,bshd->bthd", p, _f32(v)).astype(q.dtype)


def gelu(x, *, approximate=False):
  return jax.nn.gelu(_f32(x), approximate=approximate).astype(x.dtype)


def cross_entropy(logits, labels, *, reduction="mean"):
  logp = jax.nn.log_softmax(_f32(logits), axis=-1)
  if jnp.issubdtype(labels.dtype, jnp.integer):
    losses = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  else:
    losses = -(labels * logp).sum(-1)
  if reduction == "none":
    return losses.astype(logits.dtype)
  return losses.mean()


def silu(x, up=None):
  y = jax.nn.silu(_f32(x))
  return (y if up is None else y * _f32(up)).astype(x.dtype)


def rope(x, positions, theta=10000.0):
  d = x.shape[-1]
  h = d // 2
  inv = theta ** (-jnp.arange(h, dtype=jnp.float32) * (2.0 / d))
  a = positions.astype(jnp.float32)[:, None] * inv
  cos, sin = jnp.cos(a)[None, :, None], jnp.sin(a)[None, :, None]
  x1, x2 = _f32(x[..., :h]), _f32(x[..., h:])
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                         -1).astype(x.dtype)


PORTS = {k: globals()[k] for k in _conventions.SITE_KERNELS}


# ------------------------------------------------------------- real tasks


class Pooled(nnx.Module):
  """Token attention with an ALiBi bias and an explicit scale, attention
  pooling over tokens (softmax over axis 1), class-major logits and their
  log-softmax over axis 0."""

  def __init__(self, rngs):
    self.embed = nnx.Linear(12, 16, rngs=rngs)
    self.qkv = nnx.Linear(16, 48, rngs=rngs)
    self.pool = nnx.Linear(16, 1, rngs=rngs)
    self.head = nnx.Linear(16, 10, rngs=rngs)

  def __call__(self, x):
    h = jnp.tanh(self.embed(x))                         # [B, T, 16]
    b, t, _ = h.shape
    q, k, v = jnp.split(self.qkv(h).reshape(b, t, 2, 24), 3, axis=-1)
    pos = jnp.arange(t)
    alibi = (-jnp.abs(pos[:, None] - pos[None, :])[None, None]
             * jnp.array([0.5, 0.25])[None, :, None, None])
    a = jax.nn.dot_product_attention(q, k, v, bias=alibi, scale=0.25)
    h = h + a.reshape(b, t, 16)
    w = jax.nn.softmax(self.pool(h), axis=1)            # [B, T, 1]
    return self.head((w * h).sum(1)).T                  # class-major [10, B]


def _pooled_task():
  def loss(model, batch):
    logp = jax.nn.log_softmax(model(batch["x"]), axis=0)   # over classes
    return -jnp.take_along_axis(logp, batch["y"][None, :], 0).mean()

  def batch_at(position):
    rng = np.random.default_rng(7 + int(position))
    return {"x": rng.standard_normal((4, 6, 12)).astype(np.float32),
            "y": rng.integers(0, 10, 4).astype(np.int32)}

  return peat.nnx_task(lambda rngs: Pooled(rngs), optax.adamw(1e-3), loss,
                       batch_at, name="pooled")


def _example(name):
  sys.path.insert(0, EXAMPLES)
  try:
    return __import__(name).task()
  finally:
    sys.path.remove(EXAMPLES)


TASKS = {
    "stock_model": lambda: _example("stock_model"),
    "stock_bf16_model": lambda: _example("stock_bf16_model"),
    "gpt": lambda: models.get_task("gpt", batch_size=2, context=16),
    "llama": lambda: models.get_task("llama", batch_size=2),
    "cnn": lambda: models.get_task("cnn", batch_size=2),
    "vit_bf16": lambda: models.get_task("vit_bf16", batch_size=2),
    "pooled": _pooled_task,
}


@functools.lru_cache(maxsize=None)
def _task(name):
  task = TASKS[name]()
  state = jax.eval_shape(lambda: task.init_state(0))
  batch = task.batch_at(0)
  counts = peat.discover_sites(task.step_fn, state, batch).counts()
  return task, state, batch, counts


#: Kernels whose sites lie inside other composites (the reference
#: attention's softmax, every composite's dots): traced apart from them.
INNER = ("dot_general", "conv_general_dilated", "softmax", "log_softmax")


@functools.lru_cache(maxsize=None)
def _all_calls(name):
  """``{kernel: calls}`` of documented-signature KUTs at every documented
  kernel's forward sites of task ``name``: the outer composite kernels in
  one abstract trace of the step, the kernels that can sit inside them
  (:data:`INNER`) in another (a substituted composite hides the sites
  inside it)."""
  task, state, batch, _ = _task(name)
  calls = {k: [] for k in _present(name)}
  for group in ([k for k in calls if k not in INNER],
                [k for k in calls if k in INNER]):
    if not group:
      continue
    subs = [peat.Substitution(
        _user.signature_checked(_recording(k, calls[k]), f"py:test:{k}", k),
        kernel=k, phase="fwd") for k in group]
    jax.eval_shape(peat.substitute(task.step_fn, *subs), state, batch)
  return {k: tuple(v) for k, v in calls.items()}


def _calls(name, kernel):
  return _all_calls(name)[kernel]


def _present(name):
  counts = _task(name)[3]
  return [k for k in _conventions.SITE_KERNELS
          if counts.get((k, "fwd"), 0)]


def _recording(kernel, calls):
  port = PORTS[kernel]

  def kut(*args, **kwargs):
    calls.append((args, kwargs))
    return port(*args, **kwargs)

  kut.__signature__ = _conventions.signature(kernel)
  return kut


def test_the_ports_have_the_documented_signatures():
  for kernel, port in PORTS.items():
    assert inspect.signature(port) == _conventions.signature(kernel), kernel


@pytest.mark.parametrize("name", list(TASKS))
def test_every_documented_signature_at_real_sites(name):
  present = _present(name)
  assert present, f"{name}: no site of a documented kernel"
  counts = _task(name)[3]
  for kernel in present:
    calls = _calls(name, kernel)
    assert len(calls) == counts[(kernel, "fwd")], (name, kernel)
    problems = [p for a, kw in calls
                for p in _conventions.check_call(kernel, a, kw)]
    assert not problems, f"{name}: " + "\n".join(problems)


def test_every_kernel_and_every_optional_argument_is_met():
  """Every documented kernel is called at a real site, and every argument
  the page says is passed only sometimes is passed at one."""
  seen = collections.defaultdict(set)
  for name in TASKS:
    for kernel in _present(name):
      for args, kwargs in _calls(name, kernel):
        bound = _conventions.signature(kernel).bind(*args, **kwargs)
        seen[kernel] |= set(bound.arguments)
  missing = [k for k in _conventions.SITE_KERNELS if not seen[k]]
  assert not missing, f"no real site calls {missing}"
  unmet = [f"{c.kernel}.{a.name}" for c in _conventions.CONVENTIONS.values()
           for a in c.args if a.passed and a.name not in seen[c.kernel]]
  assert not unmet, f"optional arguments no real site passed: {unmet}"
