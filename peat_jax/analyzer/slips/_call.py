"""A call as the grammar sees it: its array arguments, what each is and
what each axis means.

The grammar perturbs the call's *array arguments* (the array leaves of
``(args, kwargs)`` in call order: what a site's tap holds and what
``peat.core.Slip.arg`` indexes), rebuilds the structured call from them
for the kind's family, and names what it changed in the kernel
engineer's words: "the filter's spatial H and W axes", "the contraction
axis of lhs", "scale and bias".
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

#: Each kind's array arguments, in call order.
ARG_NAMES = {
    "dot_general": ("lhs", "rhs"),
    "conv_general_dilated": ("input", "filter"),
    "softmax": ("x",), "log_softmax": ("x",),
    "layer_norm": ("x", "scale", "bias"),
    "rms_norm": ("x", "scale"),
    "attention": ("q", "k", "v", "mask"),
    "gelu": ("x",), "silu": ("gate", "up"),
    "rope": ("x", "positions"),
    "cross_entropy": ("logits", "labels"),
}


class Call(NamedTuple):
  """One call: its kind, array arguments and how to rebuild it.

  Attributes:
    kind: the site kind.
    arrays: the array arguments (host arrays: floating ones float64).
    rebuild: ``rebuild(arrays) -> (args, kwargs)``.
    names: each array argument's name.
    roles: each array argument's axis roles (a name per axis).
  """

  kind: str
  arrays: tuple
  rebuild: Callable[[Sequence[Any]], tuple]
  names: tuple[str, ...]
  roles: tuple[tuple[str, ...], ...]

  def structured(self, arrays: Sequence[Any] | None = None) -> tuple:
    """``(args, kwargs)`` of the call on ``arrays`` (its own: None)."""
    return self.rebuild(self.arrays if arrays is None else arrays)

  @property
  def kwargs(self) -> Mapping[str, Any]:
    return self.rebuild(self.arrays)[1]

  def floating(self, i: int) -> bool:
    """Whether array argument ``i`` is floating."""
    return np.issubdtype(np.asarray(self.arrays[i]).dtype, np.floating)


def _host(x):
  a = np.asarray(x)
  if np.issubdtype(a.dtype, np.floating) or a.dtype.name in (
      "bfloat16", "float16"):
    return np.asarray(a, np.float64)
  return a


def make_call(kind: str, args: Sequence[Any],
              kwargs: Mapping[str, Any] | None) -> Call:
  """The :class:`Call` of a kind's structured arguments."""
  leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs or {})))
  is_array = [_is_arr(x) for x in leaves]
  arrays = tuple(_host(x) for x, a in zip(leaves, is_array) if a)
  fixed = [None if a else x for x, a in zip(leaves, is_array)]

  def rebuild(arrs):
    it = iter(arrs)
    return jax.tree.unflatten(treedef, [next(it) if a else v
                                        for v, a in zip(fixed, is_array)])

  args2, kwargs2 = rebuild(arrays)
  names = _names(kind, args2, kwargs2, len(arrays))
  roles = tuple(_roles(kind, names[i], np.ndim(a), kwargs2)
                for i, a in enumerate(arrays))
  return Call(kind, arrays, rebuild, names, roles)


def _names(kind: str, args, kwargs, count: int) -> tuple[str, ...]:
  """Each array argument's name: the kind's, in call order, with a keyword
  argument named by its key."""
  known = ARG_NAMES.get(kind, ())
  out = [known[i] if i < len(known) else f"argument {i}"
         for i, a in enumerate(args) if _is_arr(a)]
  out += [k for k, v in kwargs.items() if _is_arr(v)]
  out += [f"argument {i}" for i in range(len(out), count)]
  return tuple(out[:count])


def _is_arr(x) -> bool:
  """An array argument, as a site's recording tells them (a constant of
  the call, a dtype or a Python number, is none)."""
  return isinstance(x, (jax.Array, np.ndarray))


def _dot_roles(name: str, ndim: int, kwargs) -> tuple[str, ...]:
  dn = kwargs.get("dimension_numbers")
  if dn is None:
    return tuple(f"axis {a}" for a in range(ndim))
  (lc, rc), (lb, rb) = dn
  con, bat = (lc, lb) if name == "lhs" else (rc, rb)
  free = "row" if name == "lhs" else "column"
  return tuple("contraction" if a in con else "batch" if a in bat else free
               for a in range(ndim))


def _conv_roles(name: str, ndim: int, kwargs) -> tuple[str, ...]:
  dn = kwargs.get("dimension_numbers")
  if dn is None or not hasattr(dn, "lhs_spec"):
    return tuple(f"axis {a}" for a in range(ndim))
  spec = dn.lhs_spec if name == "input" else dn.rhs_spec
  first, second = (("batch", "input feature") if name == "input"
                   else ("output feature", "input feature"))
  roles = [""] * ndim
  roles[spec[0]], roles[spec[1]] = first, second
  for j, a in enumerate(spec[2:]):
    roles[a] = f"spatial {'HWD'[j] if j < 3 else j}"
  return tuple(roles)


_ROLES = {
    "attention": {"q": ("batch", "query", "head", "head_dim"),
                  "k": ("batch", "key", "head", "head_dim"),
                  "v": ("batch", "key", "head", "value_dim")},
    "rope": {"x": ("batch", "position", "head", "head_dim"),
             "positions": ("position",)},
}


def _roles(kind: str, name: str, ndim: int, kwargs) -> tuple[str, ...]:
  """What each axis of an argument is."""
  if kind == "dot_general":
    return _dot_roles(name, ndim, kwargs)
  if kind == "conv_general_dilated":
    return _conv_roles(name, ndim, kwargs)
  known = _ROLES.get(kind, {}).get(name)
  if known is not None and len(known) == ndim:
    return known
  last = {"softmax": "normalized", "log_softmax": "normalized",
          "cross_entropy": "class", "layer_norm": "feature",
          "rms_norm": "feature"}.get(kind)
  if last is None or ndim == 0:
    return tuple(f"axis {a}" for a in range(ndim))
  if name == "labels":  # one class id per row
    return ("row",) * ndim
  if name in ("scale", "bias") or ndim == 1:
    return ("feature",) * ndim if last == "feature" else (last,)
  return ("row",) * (ndim - 1) + (last,)


def axis_phrase(call: Call, arg: int, axes: Sequence[int]) -> str:
  """``"the filter's spatial H and W axes"``: an argument's axes in words."""
  roles = call.roles[arg]
  words = [roles[a] if a < len(roles) and roles[a] else f"axis {a}"
           for a in axes]
  if len(words) == 2 and words[0].startswith("spatial ") and words[
      1].startswith("spatial "):
    return (f"{call.names[arg]}'s spatial {words[0][8:]} and "
            f"{words[1][8:]} axes")
  joined = " and ".join(words)
  plural = "axes" if len(words) > 1 else "axis"
  return f"{call.names[arg]}'s {joined} {plural} ({', '.join(map(str, axes))})"


def reduction_axis(call: Call) -> tuple[int, int] | None:
  """``(argument, axis)`` of the kind's reduction on an operand it is
  linear in (dot_general: lhs's last contracting dimension; conv: the
  filter's input-feature axis), or None for kinds reduced inside their
  family."""
  kw = call.kwargs
  if call.kind == "dot_general" and kw.get("dimension_numbers") is not None:
    (lc, _), _ = kw["dimension_numbers"]
    return (0, int(lc[-1])) if len(lc) else None
  if call.kind == "conv_general_dilated":
    dn = kw.get("dimension_numbers")
    if dn is not None and hasattr(dn, "rhs_spec"):
      return 1, int(dn.rhs_spec[1])
  return None


def reduction_length(call: Call) -> int | None:
  """The length of the kind's reduction (None: no reduction)."""
  lin = reduction_axis(call)
  if lin is not None:
    return int(np.shape(call.arrays[lin[0]])[lin[1]])
  if call.kind in ("softmax", "log_softmax", "cross_entropy", "layer_norm",
                   "rms_norm") and call.arrays:
    return int(np.shape(call.arrays[0])[-1]) if np.ndim(
        call.arrays[0]) else None
  if call.kind == "attention" and len(call.arrays) >= 2:
    return int(np.shape(call.arrays[1])[1])
  return None
