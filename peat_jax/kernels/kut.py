"""KUT registry: spec strings -> site selections and kernel-under-test callables.

A *KUT spec* names a kernel under test and where it runs in a training step:

| spec | sites | KUT |
| --- | --- | --- |
| ``golden`` | every forward ``dot_general`` | :data:`peat_jax.GOLDEN` |
| ``native:matmul:<variant>`` | forward ``dot_general`` | native batched matmul through :func:`dot_general_adapter` |
| ``native:conv2d:<variant>`` | forward ``conv_general_dilated`` (NHWC/HWIO, no dilation, one group) | native conv2d |
| ``native:softmax:<variant>`` | composite ``softmax`` sites (forward) | native softmax |
| ``native:layer_norm:<variant>`` | composite ``layer_norm`` sites (forward) | native layer norm (``eps`` passed through) |
| ``native:rms_norm:<variant>`` | composite ``rms_norm`` sites (forward) | native RMS norm, ``kut(x, scale, eps)`` |
| ``native:silu:<variant>`` | composite ``silu`` sites (forward) | native SiLU / SwiGLU, ``kut(x)`` or ``kut(x, up)`` |
| ``native:rope:<variant>`` | composite ``rope`` sites (forward) | native rotary embedding, ``kut(x, positions, *, theta)`` |

The user's own kernels (:mod:`peat_jax.kernels._user`, docs/kernels.md),
each with the site kernel it replaces (``kernel=``; the parsed spec ends
with ``@<kernel>``):

| spec | KUT |
| --- | --- |
| ``py:<module>:<function>`` | a JAX callable with the site kernel's KUT signature |
| ``ffi:<library.so>:<forward>[:<backward>]`` | the user's XLA FFI handlers, by the kernel's FFI calling convention |
| ``torch:<module>:<function>`` | a torch function through the PyTorch bridge |

``golden@<kernel>`` runs the golden kernel at the sites of another kernel.

Backward sites keep the golden kernel (``backward="golden"``, the default:
the forward-only question); with ``backward="kut"`` the KUT's VJP runs at
the backward sites of the selected forward sites (docs/kernels.md: for a
native kernel, its backward FFI target; for a torch KUT, torch autograd
through the bridge; for a registered KUT, its own ``custom_vjp`` or JAX's
autodiff of it). Variants are those of :func:`peat_jax.kernels.native.variants`; a spec may
end with ``@<tile>`` to set the native kernel's tile
(``native:matmul:tile_edge_bug@24``).

Deliberately broken KUTs (docs/reliability.md) test campaign isolation:
``native:<matmul|conv2d>:<crash_segv|crash_abort|hang|oom>[@<n>]`` crash
the process, hang or exhaust memory at the selected sites, or with ``@<n>``
only at those whose reduction length is ``n`` (the golden kernel runs at
the others). :func:`known_specs` does not list them.

>>> subs = resolve_kut("native:matmul:acc_bf16")          # doctest: +SKIP
>>> step = jax.jit(peat.substitute(task.step_fn, *subs))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.core import PeatError
from peat_jax.sites import GOLDEN
from peat_jax.sites import Substitution
from peat_jax.kernels import _user
from peat_jax.kernels import _user_ffi
from peat_jax.kernels._adapters import batched_matmul_layout
from peat_jax.kernels._adapters import conv_adapter
from peat_jax.kernels._adapters import dot_general_adapter
from peat_jax.kernels._adapters import dot_general_reduction
from peat_jax.kernels import _variants

__all__ = ["BACKWARD", "CheckedSpec", "KutSpec", "as_spec",
           "batched_matmul_layout", "broken_adapter", "check_backward",
           "checked", "conv_adapter", "dot_general_adapter", "is_broken",
           "known_specs", "parse_kut", "register_kut", "register_source",
           "resolve_kut"]

# native kernel -> (site kernel name, phase)
_SITE_KERNEL = {
    "matmul": "dot_general",
    "conv2d": "conv_general_dilated",
    "softmax": "softmax",
    "layer_norm": "layer_norm",
    "rms_norm": "rms_norm",
    "silu": "silu",
    "rope": "rope",
}

# Native kernels without a tile: a spec of theirs with ``@<tile>`` is
# refused (layer_norm's tile is accepted and ignored, as it always was).
_UNTILED = frozenset({"rms_norm", "silu", "rope"})


class KutSpec(NamedTuple):
  """A parsed KUT spec.

  Attributes:
    spec: the spec string as given.
    source: ``"golden"``, ``"native"`` or ``"custom"`` (:func:`register_kut`).
    kernel: native kernel name (``"matmul"``...) or ``"dot_general"`` for
      golden.
    variant: the native variant (``"default"`` for golden).
    tile: the native tile, or None for the kernel's default.
    site_kernel: kernel name of the sites it replaces.
    parts: the user's code (sources ``py``, ``ffi``, ``torch``):
      ``(module, function)``, or ``(library path, forward symbol,
      backward symbol or None)``; empty otherwise.
  """

  spec: str
  source: str
  kernel: str
  variant: str
  tile: int | None
  site_kernel: str
  parts: tuple = ()


# name -> (callable, site kernel); see register_kut.
_CUSTOM: dict[str, tuple[Callable, str]] = {}


def register_kut(name: str, kut: Callable, *, kernel: str) -> None:
  """Registers a user KUT under a spec name (e.g. ``"mine:matmul"``).

  Args:
    name: the spec name; must not be ``golden`` or start with ``native:``.
    kut: the kernel under test with the site kernel's KUT signature
      (docs/sites.md): primitives get operands and params as keywords,
      composites the marked function's arguments.
    kernel: the site kernel it replaces at forward sites, e.g.
      ``"dot_general"`` or ``"softmax"``.

  Raises:
    PeatError: a reserved name.
  """
  if (name == "golden" or name.startswith(("native:", "py:", "ffi:"))
      or "@" in name or (name.startswith("torch:") and name.count(":") > 1)):
    raise PeatError(f"KUT name {name!r} is reserved; expected a name that is "
                    "not 'golden', has no '@', does not start with "
                    "'native:', 'py:' or 'ffi:' and is not "
                    "'torch:<module>:<function>'")
  _CUSTOM[name] = (kut, kernel)


def register_source(source: str, resolver: Callable[[KutSpec], Callable]
                    ) -> None:
  """Registers how the KUTs of a user source are built from their spec.

  The PyTorch bridge registers ``"torch"`` (``torch:<module>:<function>``
  specs) when it is imported.

  Args:
    source: a user source of :class:`KutSpec` (``"torch"``).
    resolver: ``KutSpec -> KUT`` with the site kernel's signature.
  """
  _user.register_resolver(source, resolver)


def known_specs() -> list[str]:
  """Every spec :func:`resolve_kut` accepts (tiles aside)."""
  out = ["golden"] + sorted(_CUSTOM)
  for k in _SITE_KERNEL:
    out += [f"native:{k}:{v}" for v in _variants.variants(k)]
  return out


def _unknown(spec: str, why: str) -> PeatError:
  return PeatError(
      f"unknown KUT spec {spec!r} ({why}); expected 'golden', "
      f"'native:<kernel>:<variant>[@tile]' with kernel one of "
      f"{', '.join(_SITE_KERNEL)}, or your own 'py:<module>:<function>', "
      "'ffi:<library.so>:<forward>[:<backward>]', "
      "'torch:<module>:<function>' with a kernel; known specs: "
      f"{', '.join(known_specs())}")


def parse_kut(spec: str, kernel: str | None = None) -> KutSpec:
  """Parses a KUT spec string.

  Args:
    spec: e.g. ``"golden"``, ``"native:matmul:acc_bf16"``,
      ``"native:matmul:tile_edge_bug@24"``, ``"py:my_kernels:softmax"``
      (with ``kernel``), ``"ffi:./libmine.so:MineMatmul:MineMatmulBwd"``.
    kernel: the site kernel a user spec (``py:``, ``ffi:``,
      ``torch:<module>:<function>``) or ``golden`` replaces, e.g.
      ``"softmax"``; for other specs None or their own site kernel.

  Returns:
    A :class:`KutSpec`. User specs get ``@<kernel>`` appended to ``spec``
    (their records' key names the kernel).

  Raises:
    PeatError: unknown source, kernel, variant or a bad tile, listing the
      known specs; for user specs a missing kernel, module, function,
      library or symbol.
  """
  if not isinstance(spec, str):
    raise PeatError(f"KUT spec must be a string, got {type(spec).__name__}")
  if kernel is not None and (not isinstance(kernel, str) or not kernel):
    raise PeatError(f"kernel must be a site kernel name such as "
                    f"'dot_general' or 'softmax'; got {kernel!r}")
  if _user.is_user_spec(spec):
    canonical, source, site_kernel, parts = _user.parse(spec, kernel)
    return KutSpec(canonical, source, site_kernel, "default", None,
                   site_kernel, parts)
  if spec == "golden" or spec.startswith("golden@"):
    site_kernel = spec.partition("@")[2] or kernel or "dot_general"
    if kernel and site_kernel != kernel:
      raise _unknown(spec, f"it names kernel {site_kernel!r}, kernel= "
                     f"{kernel!r}")
    name = "golden" if site_kernel == "dot_general" else f"golden@{site_kernel}"
    return KutSpec(name, "golden", site_kernel, "default", None, site_kernel)
  parsed = _parse_builtin(spec)
  if kernel is not None and kernel != parsed.site_kernel:
    raise PeatError(f"KUT spec {spec!r} replaces {parsed.site_kernel!r} "
                    f"sites; kernel={kernel!r} does not match. Fix: drop "
                    "--kernel, or give the spec of a KUT of that kernel")
  return parsed


def _parse_builtin(spec: str) -> KutSpec:
  """A registered or native spec (parse_kut without kernel)."""
  if spec in _CUSTOM:
    return KutSpec(spec, "custom", spec, "default", None, _CUSTOM[spec][1])
  body, _, tile_s = spec.partition("@")
  parts = body.split(":")
  if parts[0] == "torch":
    raise _unknown(spec, "torch KUTs are registered by the PyTorch bridge: "
                   "`import peat_jax.bridges` registers the built-in "
                   "torch:<name> specs (torch:matmul, torch:conv2d, ...) and "
                   "peat_jax.bridges.register_torch_kut(name, fn, kernel=...) "
                   "your own")
  if len(parts) != 3 or parts[0] != "native":
    raise _unknown(spec, "not registered and not of the form "
                   "native:<kernel>:<variant>")
  _, kernel, variant = parts
  if kernel not in _SITE_KERNEL:
    raise _unknown(spec, f"kernel {kernel!r} is not a native kernel")
  broken = (variant in _variants.BROKEN_MODES
            and kernel in _variants.BROKEN_KERNELS)
  if variant not in _variants.variants(kernel) and not broken:
    raise _unknown(spec, f"variant {variant!r} is not one of "
                   f"{', '.join(_variants.variants(kernel))}")
  tile = None
  if tile_s:
    try:
      tile = int(tile_s)
    except ValueError:
      tile = -1
    if tile < 1:
      raise _unknown(spec, f"tile {tile_s!r} is not a positive integer")
    if kernel in _UNTILED:
      raise _unknown(spec, f"native {kernel} has no tile; drop "
                     f"'@{tile_s}'")
  return KutSpec(spec, "native", kernel, variant, tile, _SITE_KERNEL[kernel])


def as_spec(spec: "str | KutSpec", kernel: str | None = None) -> KutSpec:
  """A parsed spec: ``spec`` itself when it is a :class:`KutSpec`.

  A spec string is parsed once, where it enters peat_jax (``validate``,
  ``playback``, ``runtime``, the tools); everything after it passes the
  :class:`KutSpec` on.

  Args:
    spec: a spec string or a parsed spec.
    kernel: as :func:`parse_kut` (for a parsed spec: None or its kernel).

  Raises:
    PeatError: as :func:`parse_kut`.
  """
  if isinstance(spec, KutSpec):
    if kernel is not None and kernel != spec.site_kernel:
      raise PeatError(f"KUT spec {spec.spec!r} replaces "
                      f"{spec.site_kernel!r} sites; kernel={kernel!r} does "
                      "not match")
    return spec
  return parse_kut(spec) if kernel is None else parse_kut(spec, kernel)


def _composite_adapter(fn: Callable, variant: str, tile: int | None,
                       kind: str) -> Callable:
  def kut(*args, **kwargs):
    if kind == "layer_norm" or kind in _UNTILED:
      # rms_norm: (x, scale, eps); silu: (x) or (x, up); rope: (x,
      # positions, theta=...): the site kernels' conventions are the
      # native functions' own.
      return fn(*args, variant=variant, **kwargs)
    opts = {} if tile is None else {"tile": tile}
    return fn(*args, variant=variant, **opts, **kwargs)
  kut.__name__ = f"native_{kind}_{variant}"
  return kut


BACKWARD = ("golden", "kut")


def check_backward(backward: str, spec: "str | KutSpec | None" = None) -> str:
  """Validates a campaign's ``backward`` setting (for a KUT spec).

  Args:
    backward: ``"golden"`` (the golden kernel at backward sites: the
      forward-only question) or ``"kut"`` (the KUT's VJP there).
    spec: the KUT, when known.

  Returns:
    ``backward``.

  Raises:
    PeatError: another value; ``"kut"`` for a deliberately broken KUT (it
      has no backward) or for an ``ffi:`` KUT that names no backward
      target.
  """
  if backward not in BACKWARD:
    raise PeatError(f"backward must be 'golden' (the golden kernel at the "
                    f"backward sites) or 'kut' (the KUT's VJP there); got "
                    f"{backward!r}")
  if backward == "kut" and spec is not None:
    s = as_spec(spec)
    if is_broken(s):
      raise PeatError(f"KUT {s.spec!r} is deliberately broken and has no "
                      "backward; run it with backward='golden'")
    if s.source == "ffi" and s.parts[2] is None:
      raise PeatError(
          f"KUT {s.spec!r} names no backward target, so its VJP cannot run "
          "at the backward sites (backward='kut'); give "
          "ffi:<library.so>:<forward>:<backward> (docs/kernels.md), or run "
          "it with backward='golden'")
  return backward


class CheckedSpec(NamedTuple):
  """A KUT spec parsed and checked for one campaign's ``backward`` setting.

  Made once where a spec enters peat_jax (:func:`checked`: ``validate``,
  ``playback``, ``runtime``, the tools) and handed down as is: the layers
  below neither parse the spec again nor check it again.

  Attributes:
    spec: the parsed spec.
    backward: ``"golden"`` or ``"kut"``, checked against the spec.
  """

  spec: KutSpec
  backward: str

  @property
  def name(self) -> str:
    """The spec string as given (the records' key)."""
    return self.spec.spec


def checked(spec: "str | KutSpec | CheckedSpec", backward: str = "golden",
            kernel: str | None = None) -> CheckedSpec:
  """Parses and checks a KUT spec once, for a campaign's ``backward``.

  Args:
    spec: a spec string, a parsed :class:`KutSpec`, or a
      :class:`CheckedSpec` (returned as is when its ``backward`` and kernel
      agree: nothing is parsed or checked again).
    backward: ``"golden"`` or ``"kut"`` (:func:`check_backward`).
    kernel: the site kernel of a user spec (:func:`parse_kut`).

  Returns:
    The :class:`CheckedSpec`.

  Raises:
    PeatError: as :func:`parse_kut` and :func:`check_backward`; a
      CheckedSpec made for another ``backward`` or kernel.
  """
  if isinstance(spec, CheckedSpec):
    if spec.backward != backward:
      raise PeatError(f"KUT {spec.name!r} was checked for "
                      f"backward={spec.backward!r}, not {backward!r}: check "
                      "it again with this setting (kernels.checked)")
    if kernel is not None and kernel != spec.spec.site_kernel:
      raise PeatError(f"KUT spec {spec.name!r} replaces "
                      f"{spec.spec.site_kernel!r} sites; kernel={kernel!r} "
                      "does not match")
    return spec
  s = as_spec(spec, kernel)
  return CheckedSpec(s, check_backward(backward, s))


def is_broken(spec: str | KutSpec) -> bool:
  """Whether a spec names a deliberately broken native kernel."""
  s = as_spec(spec)
  return s.source == "native" and s.variant in _variants.BROKEN_MODES


def broken_adapter(lhs: jax.Array, rhs: jax.Array, *, kernel: str,
                   variant: str, reduction: int | None, site: str = "?",
                   **params) -> jax.Array:
  """A broken KUT at a ``dot_general`` or ``conv_general_dilated`` site.

  Calls :func:`peat_jax.kernels.native.broken` (which crashes, hangs or
  exhausts memory) when ``reduction`` is None or equals the site's
  reduction length; otherwise the golden kernel.

  Args:
    lhs: left operand.
    rhs: right operand.
    kernel: the site kernel, ``dot_general`` or ``conv_general_dilated``.
    variant: a broken variant (``crash_segv``, ``crash_abort``, ``hang``,
      ``oom``).
    reduction: break only at sites with this reduction length.
    site: the site's name (unused; conv sites pass it).
    **params: the primitive's parameters.

  Returns:
    The golden result at the sites it spares.
  """
  del site
  from jax import lax
  prim = (lax.dot_general_p if kernel == "dot_general"
          else lax.conv_general_dilated_p)
  golden = lambda a, b: prim.bind(a, b, **params)
  if kernel == "dot_general":
    red = dot_general_reduction([lhs.shape], params["dimension_numbers"])
  else:
    out_dim = params["dimension_numbers"].rhs_spec[0]
    red = int(np.prod(rhs.shape) // rhs.shape[out_dim])
  if reduction is not None and red != reduction:
    return golden(lhs, rhs)
  from peat_jax.kernels import native  # loads the FFI library on first use
  return native.broken(lhs, rhs, jax.eval_shape(golden, lhs, rhs),
                       variant=variant)


def kut_callable(spec: str | KutSpec, site: str = "?") -> Any:
  """The callable (or GOLDEN) of a spec, with the site kernel's signature."""
  s = as_spec(spec)
  if s.source == "golden":
    return GOLDEN
  if s.source == "ffi":
    return _user_ffi.ffi_kut(s)
  if s.source in _user.SOURCES:
    return _user.user_callable(s)
  if s.source == "custom":
    return _CUSTOM[s.spec][0]
  if is_broken(s):
    return functools.partial(broken_adapter, kernel=s.site_kernel,
                             variant=s.variant, reduction=s.tile)
  if s.kernel == "matmul":
    return functools.partial(dot_general_adapter, variant=s.variant,
                             tile=s.tile)
  if s.kernel == "conv2d":
    return functools.partial(conv_adapter, variant=s.variant, tile=s.tile,
                             site=site)
  from peat_jax.kernels import native  # loads the FFI library on first use
  return _composite_adapter(native.KERNELS[s.kernel], s.variant, s.tile,
                            s.kernel)


def resolve_kut(spec: "str | KutSpec", *, pattern: str | None = None,
                sites: Sequence[str] | None = None,
                backward: str = "golden",
                kernel: str | None = None) -> list[Substitution]:
  """Turns a KUT spec into the substitutions that run it.

  Args:
    spec: a spec string (module docstring; :func:`known_specs`) or a
      parsed :class:`KutSpec`.
    kernel: the site kernel of a user spec (:func:`parse_kut`).
    pattern: optional ``fnmatch`` glob narrowing the sites.
    sites: optional explicit site names.
    backward: ``"golden"`` (default) or ``"kut"``: the KUT's VJP at the
      backward sites of the selected forward sites
      (:class:`peat_jax.Substitution`).

  Returns:
    A list of :class:`peat_jax.Substitution` selecting forward sites of the
    spec's kernel.

  Raises:
    PeatError: unknown spec.
  """
  s = as_spec(spec, kernel)
  return [Substitution(kut_callable(s), kernel=s.site_kernel, phase="fwd",
                       pattern=pattern,
                       sites=None if sites is None else tuple(sites),
                       backward=backward)]


def recording(kut: Any, site: str, kernel: str, composite: bool,
              store: dict, *, vjp: bool = False) -> Callable:
  """Wraps a KUT so each trace records the site's call parameters.

  ``store[site]`` gets the primitive's params (primitives) or the call
  template ``{"template": (treedef, leaves, is_array)}`` (composites), which
  :func:`reference_fn` turns into a float64 reference. ``GOLDEN`` is wrapped
  in the golden primitive / a pass-through for composites is not possible,
  so golden KUTs are recorded with the lax function of the kernel.

  ``vjp=True`` marks a composite's backward site: the template (of the
  forward call the KUT's VJP runs at) gets ``"vjp": True``, and the site's
  reference is the VJP of the float64 reference
  (:func:`peat_jax.analyzer.reference_vjp_fn`).
  """
  def wrapped(*args, **kwargs):
    if composite:
      leaves, treedef = jax.tree.flatten((args, kwargs))
      is_array = tuple(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)
      store[site] = {"template": (treedef, tuple(
          None if a else x for x, a in zip(leaves, is_array)), is_array)}
      if vjp:
        store[site]["vjp"] = True
    else:
      store[site] = dict(kwargs)
    if kut == GOLDEN:
      return _golden_call(kernel, args, kwargs)
    if kernel == "conv_general_dilated" and isinstance(kut, functools.partial):
      return kut(*args, **{**kwargs, "site": site})
    return kut(*args, **kwargs)
  return wrapped


def _golden_call(kernel: str, args, kwargs):
  from jax import lax
  if kernel == "dot_general":
    return lax.dot_general_p.bind(*args, **kwargs)
  if kernel == "conv_general_dilated":
    return lax.conv_general_dilated_p.bind(*args, **kwargs)
  raise PeatError(f"recording a GOLDEN KUT at a {kernel!r} site is not "
                  "supported; expected dot_general or conv_general_dilated")
