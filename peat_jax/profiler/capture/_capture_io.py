"""Capture files: one ``.npz`` per (step, site), an index, a parameter codec.

A captures directory (``<campaign>/captures/``, docs/campaign.md) holds::

  index.json                   settings, one entry per captured record, the
                               records skipped for the budget
  step_<s>/<site>.npz          in0, in1, ... (the site's inputs) and out0, ...
                               (the golden kernel's outputs) of step s

Arrays are stored uncompressed (``np.savez``), so a record's size is known
before it is written (:func:`planned_bytes` is an upper bound of the file
size). Dtypes numpy cannot store (``bfloat16``, the fp8 formats) are stored
as unsigned integers of the same width; the index keeps the real dtype, the
shape and the SHA-256 of each array's bytes, and :func:`load_record` checks
all three, so a corrupt or truncated file raises :class:`PeatError` naming
it.

The call parameters a site needs to be rerun without the model (a
primitive's ``dimension_numbers``, strides, padding..., a composite call's
static arguments and its argument structure) are stored in the index as
JSON by :func:`encode_params` and rebuilt by :func:`decode_params`.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.profiler import files as _files
from peat_jax import sites as _sites
from peat_jax.core import PeatError

INDEX_FILE = _files.CAPTURE_INDEX_FILE
FORMAT_VERSION = 1
#: bytes of one array's .npy header and zip entries, at most (upper bound).
_ARRAY_OVERHEAD = 320
#: bytes of one .npz file's zip directory end records, at most.
_FILE_OVERHEAD = 160


# ------------------------------------------------------------------ sizes


def planned_bytes(shapes_dtypes: Mapping[str, tuple[tuple, Any]]) -> int:
  """Upper bound of the ``.npz`` size of arrays with these shapes and dtypes.

  Args:
    shapes_dtypes: ``{array name: (shape, dtype)}``.

  Returns:
    Data bytes plus a fixed allowance per array (header, zip entries) and
    per file; :func:`record_bytes` never writes more.
  """
  total = _FILE_OVERHEAD
  for name, (shape, dtype) in shapes_dtypes.items():
    data = int(np.prod(shape, dtype=np.int64)) * jnp.dtype(dtype).itemsize
    # the .npy header grows by 64 bytes per 64 characters of shape text.
    header = 64 * math.ceil(len(str(tuple(shape))) / 64)
    total += data + _ARRAY_OVERHEAD + header + 2 * len(name)
  return total


# ---------------------------------------------------------------- arrays


write_file = _files.write_file


def record_bytes(arrays: Mapping[str, Any]) -> tuple[bytes, dict]:
  """Serializes one record's arrays to ``.npz`` bytes.

  Args:
    arrays: ``{name: array}``; names are ``in<i>`` / ``out<i>``.

  Returns:
    ``(file bytes, {name: {"dtype", "shape", "sha256"}})``.
  """
  return _files.arrays_bytes(arrays)


def load_record(captures_dir: str, entry: Mapping[str, Any]
                ) -> dict[str, np.ndarray]:
  """Loads and checks one captured record.

  Args:
    captures_dir: the captures directory.
    entry: the record's index entry (``file``, ``bytes``, ``arrays``).

  Returns:
    ``{name: array}`` with the stored dtypes and shapes.

  Raises:
    PeatError: missing, truncated or corrupt file, or an array whose dtype,
      shape or SHA-256 differs from the index; the message names the file.
  """
  return _files.load_arrays(
      os.path.join(captures_dir, entry["file"]), entry["arrays"],
      size=entry["bytes"],
      label="capture file",
      what=(f"the record of site {entry['site']!r} at step "
            f"{entry['step']} (arrays {sorted(entry['arrays'])})"),
      fix=("Fix: run the profile again (it recaptures missing records) or "
           "delete the file and its index entry."))


# ----------------------------------------------------------------- index


def read_index(captures_dir: str) -> dict:
  """Reads ``<captures_dir>/index.json``.

  Raises:
    PeatError: missing or unreadable index, or another format version.
  """
  path = os.path.join(captures_dir, INDEX_FILE)
  if not os.path.exists(path):
    raise PeatError(f"no capture index at {path}; expected a directory made "
                    "by the golden profile (a campaign directory or its "
                    "captures/ folder)")
  try:
    with open(path) as f:
      index = json.load(f)
  except (OSError, ValueError) as e:
    raise PeatError(f"capture index {path} is corrupt ({e}); run the profile "
                    "again to rewrite it") from e
  if index.get("format") != FORMAT_VERSION:
    raise PeatError(f"capture index {path} has format {index.get('format')}"
                    f"; expected {FORMAT_VERSION}")
  return index


def write_index(captures_dir: str, index: Mapping[str, Any]) -> None:
  """Writes ``index.json`` atomically."""
  write_file(os.path.join(captures_dir, INDEX_FILE),
             json.dumps(index, indent=1).encode())


# ------------------------------------------------------- parameter codec


class _Slot:
  """Placeholder of the i-th array argument in a stored call structure."""

  def __init__(self, i: int):
    self.i = i


def _dtype_name(x) -> str | None:
  if isinstance(x, np.dtype):
    return x.name
  if isinstance(x, type) and issubclass(x, np.generic):
    return np.dtype(x).name
  return None


def encode_value(x: Any, where: str) -> Any:
  """Encodes one parameter value as JSON-ready data.

  Supported: None, bool, int, float, str, numpy scalars, dtypes, tuples,
  lists, dicts with string keys, ``lax.ConvDimensionNumbers`` and enums of
  jax modules (``lax.Precision``).

  Args:
    x: the value.
    where: its name, for the error message.

  Returns:
    JSON-ready data for :func:`decode_value`.

  Raises:
    PeatError: a value of another type, naming ``where``.
  """
  if x is None or isinstance(x, (bool, str)):
    return x
  if isinstance(x, (int, float)) and not isinstance(x, enum.Enum):
    return x
  if isinstance(x, _Slot):
    return {"array": x.i}
  if isinstance(x, np.generic):
    return {"np": x.dtype.name, "v": x.item()}
  name = _dtype_name(x)
  if name is not None:
    return {"dtype": name}
  if isinstance(x, lax.ConvDimensionNumbers):
    return {"conv_dn": [list(x.lhs_spec), list(x.rhs_spec),
                        list(x.out_spec)]}
  if isinstance(x, enum.Enum) and type(x).__module__.startswith("jax"):
    return {"enum": f"{type(x).__module__}:{type(x).__qualname__}",
            "name": x.name}
  if isinstance(x, tuple):
    return {"tuple": [encode_value(v, f"{where}[{i}]")
                      for i, v in enumerate(x)]}
  if isinstance(x, list):
    return {"list": [encode_value(v, f"{where}[{i}]")
                     for i, v in enumerate(x)]}
  if isinstance(x, dict) and all(isinstance(k, str) for k in x):
    return {"dict": {k: encode_value(v, f"{where}.{k}") for k, v in x.items()}}
  raise PeatError(
      f"cannot store call parameter {where} of type {type(x).__name__} "
      f"({x!r:.80}); expected numbers, strings, dtypes, tuples, lists, dicts,"
      " ConvDimensionNumbers or jax enums. Fix: leave this site out of the "
      "capture selection")


def decode_value(d: Any) -> Any:
  """Inverse of :func:`encode_value`."""
  if not isinstance(d, dict):
    return d
  if "array" in d:
    return _Slot(d["array"])
  if "np" in d:
    return np.dtype(d["np"]).type(d["v"])
  if "dtype" in d:
    return jnp.dtype(d["dtype"])
  if "conv_dn" in d:
    return lax.ConvDimensionNumbers(*(tuple(s) for s in d["conv_dn"]))
  if "enum" in d:
    module, qual = d["enum"].split(":")
    if not module.startswith("jax"):
      raise PeatError(f"stored enum {d['enum']!r} is not a jax enum")
    obj = importlib.import_module(module)
    for part in qual.split("."):
      obj = getattr(obj, part)
    return obj[d["name"]]
  if "tuple" in d:
    return tuple(decode_value(v) for v in d["tuple"])
  if "list" in d:
    return [decode_value(v) for v in d["list"]]
  if "dict" in d:
    return {k: decode_value(v) for k, v in d["dict"].items()}
  raise PeatError(f"unknown stored parameter {d!r:.80}")


def eqn_at(closed, address: tuple):
  """The equation at a site's ``address`` in a closed jaxpr."""
  eqn = closed.jaxpr.eqns[address[0]]
  for j, i in zip(address[1::2], address[2::2]):
    eqn = _sites.sub_jaxprs(eqn)[j][0].eqns[i]
  return eqn


def encode_params(site: _sites.Site, eqn) -> dict:
  """The stored call parameters of a site's equation.

  Primitive sites store the primitive's parameters; composite sites the
  structure of the marked call's ``(args, kwargs)`` with array slots and
  static values (docs/campaign.md).

  Raises:
    PeatError: a parameter that cannot be stored, naming the site.
  """
  if site.composite:
    call = _sites.composite_of(eqn)
    if call.calls_module:
      raise PeatError(f"cannot capture composite site {site.name!r}: it "
                      "calls a Flax module (peat.composite_call), which "
                      "cannot be rebuilt without the model. Fix: leave it "
                      "out of the capture selection")
    structure = call.rebuild([_Slot(i) for i in range(sum(call.is_array))])
    return {"composite": encode_value(structure, site.name)}
  return {"primitive": encode_value(dict(eqn.params), site.name)}


def decode_params(stored: Mapping[str, Any]) -> dict:
  """Rebuilds what ``kut.recording`` records for a site.

  Returns:
    A primitive's keyword parameters, or for a composite ``{"template":
    (treedef, leaves, is_array)}`` (what :func:`kut.reference_fn` takes).
  """
  if "primitive" in stored:
    return decode_value(stored["primitive"])
  structure = decode_value(stored["composite"])
  leaves, treedef = jax.tree.flatten(structure)
  is_array = tuple(isinstance(x, _Slot) for x in leaves)
  return {"template": (treedef, tuple(None if a else x for x, a in
                                      zip(leaves, is_array)), is_array)}


def site_of(entry: Mapping[str, Any]) -> _sites.Site:
  """Rebuilds the :class:`peat_jax.Site` of an index entry."""
  tup = lambda xs: tuple(tuple(x) for x in xs)
  return _sites.Site(
      entry["site"], entry["kernel"], entry["phase"], entry["path"],
      entry["ordinal"], entry["composite"], tup(entry["in_shapes"]),
      tuple(entry["in_dtypes"]), tup(entry["out_shapes"]),
      tuple(entry["out_dtypes"]), tuple(entry["where"]), entry["recompute"],
      tuple(entry["address"]))


def site_fields(site: _sites.Site) -> dict:
  """The JSON fields of a site stored in an index entry."""
  return {"site": site.name, "kernel": site.kernel, "phase": site.phase,
          "path": site.path, "ordinal": site.ordinal,
          "composite": site.composite,
          "in_shapes": [list(s) for s in site.in_shapes],
          "in_dtypes": list(site.in_dtypes),
          "out_shapes": [list(s) for s in site.out_shapes],
          "out_dtypes": list(site.out_dtypes), "where": list(site.where),
          "recompute": site.recompute, "address": list(site.address)}
