"""The field's random-input correctness checks, as the escape suite runs them.

Each takes a :class:`Problem` (the kernel's unit-test form: its inputs'
shapes, how the KUT and the golden kernel are called) and the KUT, and
returns a :class:`Outcome`:

* :func:`kernelbench`: KernelBench's ``run_and_check_correctness``: trial
  seeds drawn from ``torch.manual_seed(42)``, 5 trials of the problem's
  ``get_inputs`` (level 1: ``torch.rand``, uniform in [0, 1)), the
  reference run first and the new kernel after it on the same tensors,
  ``torch.allclose(atol=rtol=1e-4)`` for float32 (1e-2 for 16-bit
  formats); forward only;
* :func:`assert_close`: a unit test with ``torch.testing.assert_close``'s
  default tolerances (float32: rtol 1.3e-6, atol 1e-5) on ``torch.randn``
  inputs (seed 0), the kernel run first and the reference after it, as in
  ``assert_close(kernel(x), reference(x))``; forward only;
* :func:`robust_kbench`: robust-kbench's check: rtol = atol = 1e-5 on the
  forward output and on the gradient of every floating-point input (a
  ``torch.randn`` output cotangent), for each of the problem's input
  settings (shapes and seeds), ``torch.randn`` inputs, reference first.

The golden kernel (JAX's own, float32) is the reference, as the PyTorch
module is in KernelBench. An exception in the kernel fails the check.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np
import torch


class Problem(NamedTuple):
  """A kernel's unit test.

  Attributes:
    name: the problem it follows (KernelBench's, where there is one).
    shapes: the shapes of its floating-point inputs (float32).
    call: ``call(kut, *inputs)``: the KUT (site-kernel signature) on them.
    golden: ``golden(*inputs)``: the golden kernel.
    settings: robust-kbench's input settings: ``(shapes, seed)`` pairs.
  """

  name: str
  shapes: tuple
  call: Callable
  golden: Callable
  settings: tuple


class Outcome(NamedTuple):
  """One protocol's result on one kernel.

  Attributes:
    passed: whether every trial passed.
    detail: the largest difference seen, or the error.
  """

  passed: bool
  detail: str


def _inputs(shapes, gen: Callable) -> list:
  return [jax.numpy.asarray(gen(tuple(s)).numpy()) for s in shapes]


def _close(a, b, rtol: float, atol: float) -> tuple[bool, float]:
  ta = torch.from_numpy(np.array(a, np.float32))
  tb = torch.from_numpy(np.array(b, np.float32))
  diff = float(torch.nan_to_num((ta - tb).abs(), nan=np.inf).max()) if (
      ta.numel()) else 0.0
  return bool(torch.allclose(ta, tb, rtol=rtol, atol=atol)), diff


def _fmt(diff: float) -> str:
  return "nan/inf" if not np.isfinite(diff) else f"{diff:.2g}"


def kernelbench(problem: Problem, kut: Callable, *, trials: int = 5,
                seed: int = 42, tol: float = 1e-4) -> Outcome:
  """KernelBench's correctness check (module docstring)."""
  torch.manual_seed(seed)
  seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item())
           for _ in range(trials)]
  fwd = jax.jit(lambda *xs: problem.call(kut, *xs))
  ref = jax.jit(problem.golden)
  worst, ok = 0.0, True
  try:
    for s in seeds:
      torch.manual_seed(s)
      xs = _inputs(problem.shapes, torch.rand)
      want = jax.block_until_ready(ref(*xs))
      got = jax.block_until_ready(fwd(*xs))
      good, diff = _close(got, want, tol, tol)
      ok &= good
      worst = max(worst, diff)
  except Exception as err:  # pylint: disable=broad-except
    return Outcome(False, f"error: {type(err).__name__}")
  return Outcome(ok, f"max |diff| {_fmt(worst)}")


def assert_close(problem: Problem, kut: Callable, *, seed: int = 0
                 ) -> Outcome:
  """``torch.testing.assert_close`` defaults on randn (module docstring)."""
  torch.manual_seed(seed)
  xs = _inputs(problem.shapes, torch.randn)
  try:
    got = jax.block_until_ready(jax.jit(
        lambda *a: problem.call(kut, *a))(*xs))
    want = jax.block_until_ready(jax.jit(problem.golden)(*xs))
    torch.testing.assert_close(torch.from_numpy(np.array(got, np.float32)),
                               torch.from_numpy(np.array(want, np.float32)))
  except AssertionError:
    return Outcome(False, f"max |diff| {_fmt(_close(got, want, 0, 0)[1])}")
  except Exception as err:  # pylint: disable=broad-except
    return Outcome(False, f"error: {type(err).__name__}")
  return Outcome(True, f"max |diff| {_fmt(_close(got, want, 0, 0)[1])}")


def _grads(fn: Callable, xs: Sequence, ct) -> list:
  out, vjp = jax.vjp(fn, *xs)
  del out
  return [np.asarray(g) for g in vjp(ct)]


def robust_kbench(problem: Problem, kut: Callable, *,
                  tol: float = 1e-5) -> Outcome:
  """robust-kbench's forward and backward check (module docstring)."""
  fwd = lambda *xs: problem.call(kut, *xs)
  worst, ok, where = 0.0, True, []
  try:
    for shapes, seed in problem.settings:
      torch.manual_seed(seed)
      xs = _inputs(shapes, torch.randn)
      want = jax.block_until_ready(jax.jit(problem.golden)(*xs))
      got = jax.block_until_ready(jax.jit(fwd)(*xs))
      good, diff = _close(got, want, tol, tol)
      worst = max(worst, diff)
      if not good:
        ok = False
        where.append("fwd")
      ct = jax.numpy.asarray(torch.randn(tuple(np.shape(want))).numpy())
      for g_want, g_got in zip(_grads(problem.golden, xs, ct),
                               _grads(fwd, xs, ct)):
        good, diff = _close(g_got, g_want, tol, tol)
        worst = max(worst, diff)
        if not good:
          ok = False
          where.append("bwd")
  except Exception as err:  # pylint: disable=broad-except
    return Outcome(False, f"error: {type(err).__name__}")
  failed = f" ({'+'.join(sorted(set(where)))})" if where else ""
  return Outcome(ok, f"max |diff| {_fmt(worst)}{failed}")


PROTOCOLS = {"KernelBench": kernelbench, "assert_close": assert_close,
             "robust-kbench": robust_kbench}
