"""The user's own kernels under test: ``py:``, ``ffi:`` and ``torch:`` specs.

| spec | KUT |
| --- | --- |
| ``py:<module>:<function>`` | a JAX callable with the site kernel's KUT signature (a Pallas kernel, a jnp formula, a ``jax.custom_vjp``; its VJP is its own where it defines one) |
| ``ffi:<library.so>:<forward>[:<backward>]`` | XLA FFI handler symbols of the user's library, called with the site kernel's FFI calling convention (docs/kernels.md), forward and backward in a ``jax.custom_vjp`` |
| ``torch:<module>:<function>`` | a torch function through the PyTorch bridge's adapter of the site kernel |

Each needs the site kernel it replaces (``--kernel``, or ``kernel=`` of
:func:`peat_jax.kernels.parse_kut`); the parsed spec string carries it as
``@<kernel>`` (``py:my_kernels:softmax@softmax``), so records and campaign
settings name the kernel too. Parsing imports the module (or loads the
library) and checks that the function (or the symbols) exist, so a bad spec
fails before any work; the KUT checks its arguments at its first call and
names the site and the calling convention it expected.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

import numpy as np

from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.kernels._conventions import SITE_KERNELS, convention

SOURCES = ("py", "ffi", "torch")

#: Site kernels with an adapter for ``ffi:`` and ``torch:`` KUTs: every
#: kernel with a calling convention.
ADAPTED_KERNELS = SITE_KERNELS


def check_preferred(what: str, dtype, preferred) -> None:
  """Refuses a site whose result dtype differs from its operands'.

  A KUT that computes in the operands' dtype (an FFI handler, a torch
  kernel) cannot return a ``preferred_element_type`` of another dtype, and
  peat_jax never casts silently.

  Args:
    what: the KUT, for the message (``"KUT ffi:..."``).
    dtype: the operands' dtype.
    preferred: the site's ``preferred_element_type`` (None: the same).

  Raises:
    PeatError: they differ.
  """
  if preferred is not None and np.dtype(preferred) != np.dtype(dtype):
    raise PeatError(
        f"{what}: the site asks for a {np.dtype(preferred)} result of "
        f"{np.dtype(dtype)} operands (preferred_element_type); the kernel "
        "computes in the operands' dtype and peat_jax never casts silently. "
        f"Select other sites, or use a KUT that returns "
        f"{np.dtype(preferred)}")


def is_user_spec(spec: str) -> bool:
  """Whether a spec string names the user's own code (py:, ffi:, torch:m:f)."""
  body = spec.rpartition("@")[0] if "@" in spec else spec
  parts = body.split(":")
  return parts[0] in ("py", "ffi") or (parts[0] == "torch" and len(parts) == 3)


def _split_kernel(spec: str, kernel: str | None) -> tuple[str, str]:
  body, at, suffix = spec.rpartition("@")
  if not at:
    body, suffix = spec, ""
  if suffix and kernel and suffix != kernel:
    raise PeatError(f"KUT spec {spec!r} names site kernel {suffix!r} but "
                    f"kernel={kernel!r} was given; expected one of them, or "
                    "both the same")
  kernel = kernel or suffix
  if not kernel:
    raise PeatError(
        f"KUT spec {spec!r} needs the site kernel it replaces: pass "
        f"--kernel=<kernel> (or kernel= to parse_kut / resolve_kut), one of "
        f"{', '.join(ADAPTED_KERNELS)} (a py: KUT may also replace any "
        "other primitive or composite kernel)")
  return body, kernel


def parse(spec: str, kernel: str | None) -> tuple[str, str, str, tuple]:
  """Checks a user spec; ``(canonical spec, source, site kernel, parts)``.

  ``parts``: ``(module, function)`` for ``py:`` and ``torch:``,
  ``(absolute library path, forward symbol, backward symbol or None)`` for
  ``ffi:``.

  Raises:
    PeatError: a malformed spec, no kernel, a kernel without an adapter,
      a module, function, file or symbol that is not found.
  """
  body, kernel = _split_kernel(spec, kernel)
  source, _, rest = body.partition(":")
  what = f"KUT spec {spec!r}"
  if source == "ffi":
    fields = rest.split(":")
    if len(fields) not in (2, 3) or not all(fields):
      raise PeatError(f"{what}: expected ffi:<library.so>:<forward "
                      "symbol>[:<backward symbol>]")
    path = os.path.abspath(os.path.expanduser(fields[0]))
    if not os.path.isfile(path):
      raise PeatError(f"{what}: library {fields[0]!r} not found ({path}); "
                      "expected the path of the shared library you built "
                      "(docs/kernels.md shows how)")
    parts = (path, fields[1], fields[2] if len(fields) == 3 else None)
    from peat_jax.kernels import _ffi  # pylint: disable=g-import-not-at-top
    _ffi.load_user_library(path, [s for s in parts[1:] if s])
  else:
    fields = rest.split(":")
    if len(fields) != 2 or not all(fields):
      raise PeatError(f"{what}: expected {source}:<module>:<function>")
    parts = tuple(fields)
    _core.user_function(parts[0], parts[1], what)
  if source in ("ffi", "torch") and kernel not in ADAPTED_KERNELS:
    raise PeatError(f"{what}: no {source} adapter for site kernel "
                    f"{kernel!r}; expected one of {', '.join(ADAPTED_KERNELS)}"
                    " (a py: KUT can replace any kernel)")
  return f"{body}@{kernel}", source, kernel, parts


def _describe(args, kwargs) -> str:
  def one(x):
    if hasattr(x, "shape") and hasattr(x, "dtype"):
      return f"{np.dtype(x.dtype).name}{list(x.shape)}"
    return repr(x)
  items = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
  return ", ".join(items)


def signature_checked(fn: Callable, spec: str, kernel: str) -> Callable:
  """``fn`` that raises PeatError when it cannot take the site's arguments.

  The check binds the arguments to ``fn``'s signature before calling it, so
  an error raised inside ``fn`` stays that error.
  """
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    sig = None
  name = getattr(fn, "__name__", repr(fn))

  @functools.wraps(fn)
  def kut(*args, **kwargs):
    if sig is not None:
      try:
        sig.bind(*args, **kwargs)
      except TypeError as err:
        raise PeatError(
            f"KUT {spec}: {name}{sig} cannot take the arguments of a "
            f"{kernel} site ({_describe(args, kwargs)}): {err}. Expected "
            f"the {kernel} calling convention {convention(kernel)} "
            "(docs/kernels.md, \"The KUT signature of each site kernel\")"
            ) from None
    return fn(*args, **kwargs)

  return kut


# source -> (KutSpec -> KUT callable); the PyTorch bridge registers "torch".
_RESOLVERS: dict[str, Callable[[Any], Callable]] = {}


def register_resolver(source: str, resolver: Callable[[Any], Callable]
                      ) -> None:
  """Registers how KUTs of a user source are built (the bridge: torch)."""
  _RESOLVERS[source] = resolver


def user_callable(spec) -> Callable:
  """The KUT of a parsed user spec, with the site kernel's signature.

  Raises:
    PeatError: a torch spec before the PyTorch bridge was imported.
  """
  if spec.source == "py":
    module, function = spec.parts
    fn = _core.user_function(module, function, f"KUT spec {spec.spec!r}")
    return signature_checked(fn, spec.spec, spec.site_kernel)
  resolver = _RESOLVERS.get(spec.source)
  if resolver is None:
    raise PeatError(f"KUT spec {spec.spec!r} runs through the PyTorch "
                    "bridge: `import peat_jax.bridges` first (the tools do "
                    "it for torch: specs)")
  return resolver(spec)
