"""The golden kernel of a fuzz variant.

A primitive site's golden kernel is its lax primitive, bound again with
the site's parameters on the variant's inputs. A composite site's golden
kernel is model code: the site's own marked function when the task is
given (found by tracing the task's step once), else, and for a variant the
site's function refuses (fewer KV heads for an attention written for equal
heads), the standard golden of its kind (:data:`STANDARD`: the library
calls of ``peat_jax.sites``'s recognized kinds, float32 inside for 16-bit
inputs and one rounding, as XLA's and Flax's normalizations compute).
Records say which (``golden_from``: ``primitive``, ``site`` or
``standard``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.kernels import checks as _checks
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import capture as io


def _wide(x):
  return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


def _softmax(x, axis=-1):
  return jax.nn.softmax(_wide(x), axis=axis).astype(x.dtype)


def _log_softmax(x, axis=-1):
  return jax.nn.log_softmax(_wide(x), axis=axis).astype(x.dtype)


def _gelu(x, approximate=False):
  return jax.nn.gelu(_wide(x), approximate=approximate).astype(x.dtype)


def _layer_norm(x, scale=None, bias=None, eps=1e-6):
  xf = _wide(x)
  mean = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
  y = (xf - mean) * lax.rsqrt(var + eps)
  if scale is not None:
    y = y * scale
  if bias is not None:
    y = y + bias
  return y.astype(x.dtype)


def _attention(q, k, v, mask=None, *, bias=None, scale=None,
               is_causal=False):
  out = jax.nn.dot_product_attention(
      _wide(q), _wide(k), _wide(v), bias, None if mask is None else
      jnp.asarray(mask, bool), scale=scale, is_causal=is_causal)
  return out.astype(q.dtype)


def _cross_entropy(logits, labels, reduction="none"):
  logp = jax.nn.log_softmax(_wide(logits), axis=-1)
  out = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  return out if reduction == "none" else jnp.mean(out)


#: kind -> golden function of the KUT convention.
STANDARD: Mapping[str, Callable] = {
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "gelu": _gelu,
    "silu": _checks.silu_golden,
    "layer_norm": _layer_norm,
    "rms_norm": _checks.rms_norm_golden,
    "rope": _checks.rope_golden,
    "attention": _attention,
    "cross_entropy": _cross_entropy,
}


def site_goldens(task: _golden.TrainTask,
                 entries: Sequence[Mapping[str, Any]]) -> dict:
  """``{site name: golden function}`` of the composite entries, from the
  task's traced step (the marked functions themselves).

  Raises:
    PeatError: an entry whose address is not a composite call of the task
      (the captures come from another task).
  """
  entries = [e for e in entries if e["composite"]]
  if not entries:
    return {}
  state = _golden.abstract_state(task)
  closed, _ = _sites.trace(task.step_fn, state, task.batch_at(0))
  out = {}
  for e in entries:
    try:
      call = _sites.composite_of(io.eqn_at(closed, tuple(e["address"])))
    except (IndexError, KeyError):
      call = None
    if call is None or call.kind != e["kernel"]:
      raise PeatError(f"site {e['site']!r} of the captures is not a "
                      f"{e['kernel']!r} call of task {task.name!r}; "
                      "expected the task the captures were made with. Fix: "
                      "pass that task, or none (standard goldens)")
    if call.calls_module:
      continue  # a Flax module's call: the standard golden serves
    out[e["site"]] = call.fn
  return out


class Golden:
  """Runs a site's golden kernel on variant calls.

  Args:
    site: the site.
    params: its decoded call parameters.
    own: the site's own marked function (composites), or None.
  """

  def __init__(self, site: _sites.Site, params: dict,
               own: Callable | None = None):
    self.site = site
    self.params = params
    self.own = own
    if not site.composite:
      self.prim = getattr(lax, f"{site.kernel}_p", None)
      if self.prim is None:
        raise PeatError(f"no lax primitive named {site.kernel}_p to run the "
                        "golden kernel of a variant")
    elif own is None and site.kernel not in STANDARD:
      raise PeatError(f"no standard golden for composite kind "
                      f"{site.kernel!r} (site {site.name!r}); expected one "
                      f"of {sorted(STANDARD)}. Fix: pass the task, whose "
                      "marked function is the golden kernel")

  def __call__(self, call) -> tuple[list[np.ndarray], str]:
    """``(outputs, golden_from)`` of one variant call."""
    args = [jnp.asarray(a) if isinstance(a, np.ndarray) else a
            for a in call.args]
    if not self.site.composite:
      out = self.prim.bind(*args, **call.kwargs)
      return [np.asarray(o) for o in jax.tree.leaves(out)], "primitive"
    frm = "standard"
    if self.own is not None:
      try:
        out = self.own(*args, **call.kwargs)
        return [np.asarray(o) for o in jax.tree.leaves(out)], "site"
      except (TypeError, ValueError) as e:
        if self.site.kernel not in STANDARD:
          raise PeatError(f"the golden kernel of site {self.site.name!r} "
                          f"refuses this variant: {e}") from e
        frm = "standard (the site's own refuses it)"
    out = STANDARD[self.site.kernel](*args, **call.kwargs)
    return [np.asarray(o) for o in jax.tree.leaves(out)], frm

  def first(self, call) -> np.ndarray:
    """The first golden output (the variants' magnitude search)."""
    return self(call)[0][0]
