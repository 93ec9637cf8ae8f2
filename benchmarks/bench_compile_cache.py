"""A fresh process's playback with and without the persistent compilation
cache.

Usage::

  python benchmarks/bench_compile_cache.py \
      [--cases=gpt/native:matmul:in_bf16,cnn/native:conv2d:in_bf16]

Per case (``scenario/KUT``): one golden run (4 steps, a checkpoint every
2; not timed), then three fresh processes, one after the other, each
playing back the same two checkpoints (0 and 2) into a campaign of its
own with ``peat.playback``:

* ``none``: no persistent cache (what every process paid before);
* ``cold``: an empty cache directory (``peat_jax.core
  .use_compilation_cache``): compiles everything and writes it;
* ``warm``: the same directory again: loads what ``cold`` wrote.

Each prints its import time, its ``playback`` wall time (both
checkpoints: the first with every compilation, the second warm), the
cache's hits and misses (``jax.monitoring``) and a hash of its record
file; the table gives each against ``none`` in the same run, and the
records must hash the same in all three (exit status 1 otherwise).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from absl import app
from absl import flags

_CASES = flags.DEFINE_list(
    "cases", ["gpt/native:matmul:in_bf16", "cnn/native:conv2d:in_bf16"],
    "scenario/KUT pairs.")

_CHILD = textwrap.dedent('''
    import collections, hashlib, json, os, sys, time
    t0 = time.perf_counter()
    from jax import monitoring
    import peat_jax as peat
    from peat_jax import core, models
    events = collections.Counter()
    monitoring.register_event_listener(
        lambda name, **kw: events.update([name]))
    cache, golden, kut, campaign = sys.argv[1:5]
    core.use_compilation_cache(cache or None)
    task = models.get_task(sys.argv[5])
    t1 = time.perf_counter()
    res = peat.playback(task, golden, kut, campaign_dir=campaign,
                        steps=[0, 2])
    t2 = time.perf_counter()
    with open(os.path.join(campaign, "playback.msgpack"), "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({
        "import_s": t1 - t0, "playback_s": t2 - t1,
        "later_s": res.seconds_per_step,
        "hits": events["/jax/compilation_cache/cache_hits"],
        "misses": events["/jax/compilation_cache/cache_misses"],
        "records": digest}))
''')

_GOLDEN = textwrap.dedent('''
    import sys
    import peat_jax as peat
    from peat_jax import models
    peat.golden_train(models.get_task(sys.argv[1]), sys.argv[2], steps=4,
                      checkpoint_every=2, evaluate=False)
''')


def _python(args, env) -> str:
  got = subprocess.run([sys.executable, "-c"] + args, capture_output=True,
                       text=True, env=env, check=False)
  if got.returncode:
    raise RuntimeError(got.stderr[-3000:])
  return got.stdout.strip().splitlines()[-1] if got.stdout.strip() else ""


def main(argv):
  del argv
  env = dict(os.environ)
  for k in ("JAX_COMPILATION_CACHE_DIR", "PEAT_JAX_COMPILATION_CACHE"):
    env.pop(k, None)
  print(f"{os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
  print("| case | process | import | playback (2 checkpoints) | of it: "
        "later checkpoint | vs none | cache hits / misses |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  same = True
  for case in _CASES.value:
    scenario, kut = case.split("/", 1)
    with tempfile.TemporaryDirectory() as tmp:
      golden = os.path.join(tmp, "golden")
      _python([_GOLDEN, scenario, golden], env)
      cache = os.path.join(tmp, "xla")
      runs = {}
      for name, where in (("none", ""), ("cold", cache), ("warm", cache)):
        campaign = os.path.join(tmp, f"campaign_{name}")
        os.makedirs(campaign)
        runs[name] = json.loads(_python(
            [_CHILD, where, golden, kut, campaign, scenario], env))
      base = runs["none"]["playback_s"]
      for name, r in runs.items():
        print(f"| {scenario} `{kut}` | {name} | {r['import_s']:.1f} s | "
              f"{r['playback_s']:.1f} s | {r['later_s'] * 1e3:.0f} ms | "
              f"{r['playback_s'] / base:.2f} | {r['hits']} / "
              f"{r['misses']} |")
      digests = {r["records"] for r in runs.values()}
      same &= len(digests) == 1
      print(f"| {scenario} `{kut}` | records | | "
            f"{'the same in all three' if len(digests) == 1 else 'DIFFER'}"
            " | | | |")
  return 0 if same else 1


if __name__ == "__main__":
  app.run(main)
