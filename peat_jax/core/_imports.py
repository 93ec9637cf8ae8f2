"""Importing the user's own code named on a command line (``module:function``).

KUT specs (``py:<module>:<function>``, ``torch:<module>:<function>``) and
tasks (``--task=<module>:<function>``) name a function of the user's module.
The module is imported from ``sys.path`` and, failing that, from the
current directory (as ``python -m`` would find it; console scripts do not
put it on ``sys.path``). Workers of isolated campaigns inherit the path.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from peat_jax.core._errors import PeatError


def import_user_module(module: str, what: str) -> Any:
  """Imports the user's module ``module``.

  Args:
    module: a dotted module name.
    what: what names it, for errors (``"KUT spec 'py:m:f'"``).

  Returns:
    The module.

  Raises:
    PeatError: the module is not found (naming where it was looked for),
      or importing it raised (naming the exception).
  """
  if not module or not all(p.isidentifier() for p in module.split(".")):
    raise PeatError(f"{what}: {module!r} is not a module name; expected a "
                    "dotted Python module name such as 'my_kernels' or "
                    "'pkg.kernels'")
  cwd = os.getcwd()
  for attempt in (0, 1):
    try:
      return importlib.import_module(module)
    except ModuleNotFoundError as err:
      missing = err.name or ""
      if module != missing and not module.startswith(missing + "."):
        raise PeatError(f"{what}: importing module {module!r} failed: it "
                        f"imports {missing!r}, which is not installed "
                        f"({err})") from err
      if attempt == 0 and cwd not in sys.path:
        sys.path.insert(0, cwd)
        continue
      top = module.split(".")[0]
      where = (f"{'/'.join(module.split('.')[:-1])}/ has no "
               f"{module.split('.')[-1]}.py" if missing != top
               else f"no {top}.py or {top}/ there")
      raise PeatError(
          f"{what}: module {module!r} cannot be imported: not found on "
          f"sys.path or in the current directory {cwd} ({where}). Fix: run "
          "from the directory that holds it, or add that directory to "
          "PYTHONPATH") from err
    except Exception as err:  # the user's module raised while importing
      raise PeatError(f"{what}: importing module {module!r} failed: "
                      f"{type(err).__name__}: {err}") from err
  raise AssertionError("unreachable")


def user_function(module: str, function: str, what: str) -> Callable:
  """``module.function`` of the user's code (see :func:`import_user_module`).

  Raises:
    PeatError: the module cannot be imported, has no such attribute, or it
      is not callable.
  """
  mod = import_user_module(module, what)
  fn = getattr(mod, function, None)
  if fn is None:
    names = sorted(n for n, v in vars(mod).items()
                   if callable(v) and not n.startswith("_"))
    raise PeatError(f"{what}: module {module!r} ({getattr(mod, '__file__', '')}"
                    f") has no function {function!r}; its public callables: "
                    f"{', '.join(names[:20]) or 'none'}")
  if not callable(fn):
    raise PeatError(f"{what}: {module}.{function} is a "
                    f"{type(fn).__name__}, not a function")
  return fn
