"""Runtime FI of data-parallel training: the KUT on every device's shard.

:func:`data_parallel_runtime` runs runtime FI with the batch split over a
``("data",)`` :class:`jax.sharding.Mesh` of local devices and the state
replicated; XLA partitions the golden computation, and the KUT (a native
XLA custom call has no SPMD partitioning rule) runs inside
:func:`jax.shard_map` on every device's shard of its operands
(:func:`shard_kut`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from peat_jax.profiler import files as _files
from peat_jax.profiler import runtime_fi as _runtime_fi
from peat_jax import sites as _sites
from peat_jax.profiler.golden import saved_steps
from peat_jax.profiler.golden import restore_on
from peat_jax.core import PeatError
from peat_jax.profiler.playback_fi import select_calls
from peat_jax.profiler.files import append_records
from peat_jax.profiler.files import read_records
from peat_jax.profiler.scaleout._scaleout import local_devices
from peat_jax.profiler.golden import TrainTask
from peat_jax.kernels import kut as _kut

#: Record file of data-parallel runtime FI (kept apart from runtime.msgpack).
RUNTIME_DP_FILE = _files.RUNTIME_DP_FILE
#: Mesh axis name of data-parallel runtime FI.
DATA_AXIS = "data"
#: Composite kinds whose KUT works row by row over the leading axis (softmax
#: and layer norm normalize the last axis; GELU is elementwise).
ROWWISE_COMPOSITES = ("softmax", "layer_norm", "gelu")




def data_mesh(devices: int | Sequence[Any] | None = None) -> Mesh:
  """A 1-D mesh ``("data",)`` over local devices (see :func:`local_devices`)."""
  return Mesh(np.array(local_devices(devices)), (DATA_AXIS,))


def _spec(ndim: int, dim: int | None) -> P:
  parts = [None] * ndim
  if dim is not None:
    parts[dim] = DATA_AXIS
  return P(*parts)


def _check_divisible(what: str, size: int, n: int) -> None:
  if size % n:
    raise PeatError(
        f"data-parallel KUT: {what} has size {size}, not a multiple of the "
        f"{n} devices of the mesh; use a batch size divisible by {n} or "
        "fewer devices")


def shard_kut(kut: Callable, kernel: str, mesh: Mesh) -> Callable:
  """Wraps a KUT so that it runs on every device's shard of its operands.

  A native KUT is an XLA custom call without an SPMD partitioning rule: in a
  step partitioned over a mesh XLA would gather its operands and run it
  whole on every device. The wrapper gives it a rule through
  :func:`jax.shard_map` over the ``"data"`` axis:

  * ``dot_general``: with batch dims, their first one on both operands;
    otherwise the first free dim of ``lhs`` (rows), ``rhs`` replicated. The
    output is split on its leading dim. Exact for any operands (each output
    row is computed from whole rows and columns).
  * ``conv_general_dilated``: the batch dim of ``lhs``, kernel replicated
    (``batch_group_count`` must be 1).
  * :data:`ROWWISE_COMPOSITES`: the leading dim of the first array argument;
    the other array arguments (scale, bias) replicated.

  The KUT sees the local shard: a KUT whose result depends on the size of
  that dim (e.g. a tiling bug at tile edges) behaves as it would with the
  per-device batch.

  Args:
    kut: the KUT with the site kernel's signature (not ``GOLDEN``).
    kernel: the site kernel it replaces.
    mesh: a mesh with a ``"data"`` axis.

  Returns:
    A KUT with the same signature.

  Raises:
    PeatError: a kernel without a rule (at construction), or a sharded dim
      not divisible by the mesh size (at trace time).
  """
  n = mesh.shape[DATA_AXIS]

  def run(body, in_specs, args):
    return jax.shard_map(body, mesh=mesh, in_specs=tuple(in_specs),
                         out_specs=P(DATA_AXIS), check_vma=False)(*args)

  if kernel == "dot_general":
    def dot(lhs, rhs, *, dimension_numbers, **params):
      (lc, rc), (lb, rb) = dimension_numbers
      if lb:
        dl, dr = int(lb[0]), int(rb[0])
      else:
        free = [d for d in range(lhs.ndim) if d not in lc]
        if not free:
          raise PeatError("data-parallel KUT: dot_general lhs "
                          f"{lhs.shape} has no free dim to split; expected "
                          "rows (e.g. a batch dim)")
        dl, dr = free[0], None
      _check_divisible(f"dot_general lhs dim {dl} {lhs.shape}",
                       lhs.shape[dl], n)
      return run(lambda a, b: kut(a, b, dimension_numbers=dimension_numbers,
                                  **params),
                 (_spec(lhs.ndim, dl), _spec(rhs.ndim, dr)), (lhs, rhs))
    return dot

  if kernel == "conv_general_dilated":
    def conv(lhs, rhs, **params):
      if params.get("batch_group_count", 1) != 1:
        raise PeatError("data-parallel KUT: a convolution with "
                        f"batch_group_count={params['batch_group_count']} "
                        "mixes batch rows; expected 1")
      dl = int(params["dimension_numbers"].lhs_spec[0])
      _check_divisible(f"conv lhs batch dim {lhs.shape}", lhs.shape[dl], n)
      out_batch = int(params["dimension_numbers"].out_spec[0])
      if out_batch != 0:
        raise PeatError("data-parallel KUT: convolution output batch dim is "
                        f"{out_batch}; expected 0 (NHWC or NCHW outputs)")
      return run(lambda a, b: kut(a, b, **params),
                 (_spec(lhs.ndim, dl), _spec(rhs.ndim, None)), (lhs, rhs))
    return conv

  if kernel in ROWWISE_COMPOSITES:
    def rowwise(*args, **kwargs):
      leaves, treedef = jax.tree.flatten((args, kwargs))
      idx = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
      if not idx or leaves[idx[0]].ndim < (1 if kernel == "gelu" else 2):
        raise PeatError(f"data-parallel KUT: {kernel} needs an array "
                        "argument with a leading row dim")
      x = leaves[idx[0]]
      _check_divisible(f"{kernel} input {x.shape}", x.shape[0], n)

      def body(*arrays):
        lv = list(leaves)
        for i, a in zip(idx, arrays):
          lv[i] = a
        a, k = jax.tree.unflatten(treedef, lv)
        return kut(*a, **k)

      specs = [_spec(leaves[i].ndim, 0 if j == 0 else None)
               for j, i in enumerate(idx)]
      return run(body, specs, [leaves[i] for i in idx])
    return rowwise

  raise PeatError(
      f"data-parallel KUT: no sharding rule for kernel {kernel!r}; rules "
      f"exist for dot_general, conv_general_dilated and "
      f"{', '.join(ROWWISE_COMPOSITES)}. Select other sites or run runtime "
      "FI on one device")


def data_parallel_substitution(task: TrainTask, state, batch,
                               kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec",
                               mesh: Mesh,
                               select: str | Sequence[str] | None = None
                               ) -> _sites.Substitution:
  """The runtime-FI substitution of a spec, its KUT wrapped by :func:`shard_kut`.

  Args:
    task: the task whose step is substituted.
    state: a state of the task (for site discovery).
    batch: a batch of the task.
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
    mesh: the data-parallel mesh.
    select: narrow the spec's sites: an ``fnmatch`` pattern or names.

  Returns:
    One :class:`peat_jax.Substitution` over every selected site (schedule
    :class:`peat_jax.EveryCall`; replace it per frequency).

  Raises:
    PeatError: unknown spec, no selected site, no sharding rule.
  """
  checked = _kut.checked(kut_spec)
  chosen, _ = select_calls(task, state, batch, checked, select)
  names = tuple(c.site.name for c in chosen)
  kut = chosen[0].sub.kut
  if kut != _sites.GOLDEN:
    kut = shard_kut(kut, checked.spec.site_kernel, mesh)
  return _sites.Substitution(kut, sites=names,
                                   backward=chosen[0].sub.backward)


def _dp_step(fn: Callable, mesh: Mesh) -> Callable:
  """``fn`` jitted with the state replicated and the batch split on dim 0."""
  repl = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P(DATA_AXIS))
  return jax.jit(fn, in_shardings=(repl, data), out_shardings=repl)


def data_parallel_runtime(task: TrainTask, golden_dir: str | os.PathLike,
                          kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec", *,
                          devices: int | Sequence[Any] | None = None,
                          frequencies: Sequence[str] = ("every", "every_4",
                                                        "fraction_0.25"),
                          steps: int = 50, start_step: int = 0,
                          seeds: Sequence[int] = (1, 2),
                          campaign_dir: str | os.PathLike | None = None,
                          select: str | Sequence[str] | None = None,
                          progress: Callable[[str], None] | None = None
                          ) -> _runtime_fi.RuntimeResult:
  """Runtime FI of data-parallel training over local devices.

  Like :func:`peat_jax.runtime`, with every train step (golden, seed runs,
  and the KUT at each frequency) jitted over a ``("data",)`` mesh: the
  batch is split over the devices, the state is replicated, XLA partitions
  the golden kernels (the loss mean and the gradients become cross-device
  reductions) and the KUT runs on each device's shard (:func:`shard_kut`).
  Records go to ``runtime_data_parallel.msgpack`` (with the device count);
  finished frequencies there are skipped. Weight distances and the bf16
  proxy are recorded as by :func:`peat_jax.runtime` (the golden
  checkpoints are restored replicated over the mesh).

  Cross-device reductions sum in another order than one device does, so
  losses are close to, not bitwise equal to, :func:`peat_jax.runtime`'s;
  with one device they are equal.

  Args:
    task: the golden run's task; its batch size must divide by the device
      count.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
    devices: None (all local), a count, or devices.
    frequencies: ``every``, ``every_<n>``, ``fraction_<p>``.
    steps: steps trained per run.
    start_step: the golden checkpoint to start from.
    seeds: seeds of the golden seed-to-seed spread.
    campaign_dir: where the record file goes (default: ``golden_dir``'s
      parent).
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    progress: called with one line per frequency.

  Returns:
    A :class:`peat_jax.RuntimeResult`.

  Raises:
    PeatError: unknown spec or frequency, a batch not divisible by the
      device count, a KUT kernel without a sharding rule.
  """
  say = progress or (lambda s: None)
  mesh = data_mesh(devices)
  n = mesh.size
  repl = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P(DATA_AXIS))
  golden_dir, ckpt, campaign_dir = _files.campaign_dirs(golden_dir,
                                                         campaign_dir)
  path = os.path.join(campaign_dir, RUNTIME_DP_FILE)
  scheds = [(f, *_runtime_fi.parse_frequency(f)) for f in frequencies]
  kut = _kut.checked(kut_spec)  # parsed and checked here, once
  kut_spec = kut.name  # the records' key
  for leaf in jax.tree.leaves(task.batch_at(0)):
    _check_divisible(f"batch leaf {np.shape(leaf)}", np.shape(leaf)[0], n)
  old = [r for r in read_records(path) if r.get("kut") == kut_spec
         and r.get("n") == steps and r.get("start") == start_step
         and r.get("devices") == n]
  byname = {r["name"]: r for r in old}
  state0 = restore_on(ckpt, task, start_step, repl)

  def batch_at(pos):
    return jax.device_put(task.batch_at(pos), data)

  def keep(name, rec):
    rec = {"kut": kut_spec, "n": steps, "start": start_step, "devices": n,
           "name": name, **rec}
    append_records(path, [rec])
    byname[name] = rec

  subs = []  # the KUT's data-parallel substitution, built on first use

  def kut_step(sched):
    if not subs:
      subs.append(data_parallel_substitution(
          task, state0, batch_at(int(state0.data_position)), kut, mesh,
          select))
    return _dp_step(_sites.substitute(
        task.step_fn, subs[0]._replace(schedule=sched)), mesh)

  weights = _runtime_fi.probe(
      task.step_fn, lambda fn: _dp_step(fn, mesh), saved=saved_steps(ckpt),
      start_step=start_step, steps=steps,
      restore=lambda s: restore_on(ckpt, task, s, repl), state=state0,
      batch=batch_at(int(state0.data_position)))
  return _runtime_fi.run_frequencies(
      scheds, byname=byname, keep=keep,
      golden_step=_dp_step(task.step_fn, mesh),
      fresh_state=lambda seed: jax.device_put(task.init_state(seed), repl),
      state0=state0, batch_at=batch_at, steps=steps, start_step=start_step,
      seeds=seeds, kut_step=kut_step, say=say, where=f" on {n} devices",
      weights=weights)
