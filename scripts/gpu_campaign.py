r"""A validate campaign whose KUT is XLA's own dot at a lower precision.

Usage::

  JAX_DEFAULT_MATMUL_PRECISION=highest python scripts/gpu_campaign.py \
      --precision=default --scenario=gpt --steps=30 --campaign_dir=DIR

The golden run's dots run at ``HIGHEST`` (float32 products and sums):
``JAX_DEFAULT_MATMUL_PRECISION=highest`` sets the precision of every dot
traced without an explicit one, in this process and in every worker process
it starts. The KUT, registered as ``xla:dot_general:<precision>``, is the
same ``dot_general`` bound with ``precision=<precision>`` at every forward
dot site. On Ampere and Hopper GPUs XLA may compute a float32 dot at
``DEFAULT`` precision with TF32 tensor cores (one pass of 10-bit mantissa
products); what the Detector names is the answer. On a CPU the two
precisions compute the same thing.

Runs :func:`peat_jax.validate` (without process isolation: the KUT is
registered in this process only); its progress lines end with the error
model of every site; then the verdict and the report's path. Exits 2 on bad input (including a golden
precision that is not ``HIGHEST``).
"""

import argparse
import os
import sys

import jax
from jax import lax

import peat_jax as peat
from peat_jax import models

_PRECISIONS = {"default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH}


def register(precision: str) -> str:
  """Registers XLA's dot_general at ``precision`` as a KUT; returns its spec.

  Args:
    precision: ``"default"`` or ``"high"`` (``lax.Precision`` names).

  Returns:
    The spec name, ``xla:dot_general:<precision>``.
  """
  chosen = (_PRECISIONS[precision],) * 2

  def xla_dot(lhs: jax.Array, rhs: jax.Array, **params) -> jax.Array:
    return lax.dot_general_p.bind(lhs, rhs, **{**params, "precision": chosen})

  name = f"xla:dot_general:{precision}"
  peat.register_kut(name, xla_dot, kernel="dot_general")
  return name


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--precision", choices=sorted(_PRECISIONS),
                 default="default", help="the KUT's dot precision")
  p.add_argument("--scenario", default="gpt")
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--checkpoint_every", type=int, default=10)
  p.add_argument("--frequencies", default="every",
                 help="runtime FI frequencies, comma-separated; empty: none")
  p.add_argument("--campaign_dir", required=True)
  args = p.parse_args(argv)
  golden = jax.config.jax_default_matmul_precision
  if str(golden).lower() not in ("highest", "float32", "precision.highest"):
    print(f"error: the golden dots run at {golden!r}, expected 'highest': "
          "run with JAX_DEFAULT_MATMUL_PRECISION=highest", file=sys.stderr)
    return 2
  spec = register(args.precision)
  directory = os.path.abspath(args.campaign_dir)
  try:
    factory = models.prepare_task_factory(
        args.scenario, os.path.join(directory, "task"), progress=print)
    paths = peat.validate(
        factory, spec, directory, steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        frequencies=tuple(f for f in args.frequencies.split(",") if f),
        scenario=args.scenario, isolate=False, progress=print)
  except peat.PeatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"golden precision: {golden}; KUT: dot_general at "
        f"{args.precision.upper()} on {jax.default_backend()} "
        f"({jax.devices()[0].device_kind})")
  print(f"verdict: {paths.verdict}")
  print(f"report: {paths.html}")
  print(f"data: {paths.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
