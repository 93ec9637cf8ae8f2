"""Interruption and determinism of whole campaigns (issue 10, parts 2 and 5).

A small campaign (CNN, a native KUT, so playback and runtime FI run in
isolated worker processes) runs in a subprocess; it is killed with SIGKILL
at seeded points across its phases (golden run, playback, runtime FI,
report), restarted each time, and finally run to completion. Its records
must equal those of an uninterrupted run exactly: playback.msgpack,
runtime.msgpack, crashes.msgpack, the golden log and the SHA-256
fingerprints of every golden checkpoint. A second uninterrupted run with
the same seed must give byte-identical record files.

Every campaign here is a fresh process that imports jax and compiles the
train step, the tapped playback step and runtime FI: about 30 s on an idle
2-core machine, several times that on a loaded one. So all of these tests
are slow.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import msgpack
import numpy as np
import pytest

from peat_jax import profiler

KUT = "native:matmul:in_bf16"
SCRIPT = textwrap.dedent(f"""
    import sys
    import peat_jax as peat
    factory = peat.TaskFactory("peat_jax.models", "get_task",
                                   {{"name": "cnn", "batch_size": 16}})
    peat.validate(factory, {KUT!r}, sys.argv[1], steps=6,
                       checkpoint_every=2, frequencies=("every", "every_2"),
                       runtime_steps=4, seed=5, timeout_s=600,
                       memory_limit_mb=4096,
                       progress=lambda s: print(s, flush=True))
    print("CAMPAIGN DONE", flush=True)
""")
# Kill points of one interrupted campaign: (progress line pattern, longest
# delay after it in seconds, how many), in campaign order. A pattern that
# opens a phase ("[2/4]") kills while its work starts up (a worker
# compiling); a completed-unit pattern ("playback step 2: 1 sites ...")
# kills in the next unit, after some records were written. Delays are
# seeded uniform. A campaign has 3 playback steps and 2 frequencies, so a
# campaign soon runs out of work to interrupt: each cycle kills one
# campaign at its points, lets it finish and compares it; cycles repeat with
# new campaigns until enough kills landed (how far a run gets before its
# kill depends on the machine's speed).
CYCLE = [
    (r"\[1/4\]", 3.0, 2),                      # golden run (Orbax saves)
    (r"\[2/4\]", 5.0, 1),                      # playback, worker starting
    (r"playback step \d+: \d+ sites", 0.0, 2),  # playback, the next step
    (r"\[3/4\]", 5.0, 1),                      # runtime FI, worker starting
    (r"runtime .*: 4 steps", 0.0, 1),           # runtime, next frequency
    (r"\[4/4\]", 0.0, 1),                      # verdict, report, summary
]
LANDED = 24  # kills to land in all (the issue asks for at least 20)
MAX_CYCLES = 6
PHASE_OF = {"[1/4]": "golden", "[2/4]": "playback", "[3/4]": "runtime",
            "[4/4]": "report"}
RUN_TIMEOUT_S = 1500


class _Run:
  """A campaign subprocess whose stdout lines are collected by a thread."""

  def __init__(self, directory):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    self.lines: list[str] = []
    self._thread = threading.Thread(target=self._read, daemon=True)
    self._thread.start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.append(line.rstrip("\n"))

  def wait_for(self, pattern: str, timeout: float) -> bool:
    """True once a line matches ``pattern``; False if the run ended."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      if any(re.match(pattern, l) for l in list(self.lines)):
        return True
      if self.proc.poll() is not None:
        self._thread.join(5)
        return any(re.match(pattern, l) for l in self.lines)
      time.sleep(0.002)
    raise AssertionError(f"no {pattern!r} within {timeout} s; output:\n"
                         + "\n".join(self.lines[-30:]))

  def phase(self) -> str:
    """The phase of the last phase line printed ("done": finished)."""
    if "CAMPAIGN DONE" in self.lines:
      return "done"
    seen = [PHASE_OF[l[:5]] for l in self.lines if l[:5] in PHASE_OF]
    return seen[-1] if seen else "start-up"

  def kill(self) -> bool:
    """SIGKILL; True when it landed: the campaign had not finished."""
    alive = (self.proc.poll() is None
             and "CAMPAIGN DONE" not in list(self.lines))
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()
    self._thread.join(5)
    return alive

  def finish(self, timeout: float = RUN_TIMEOUT_S) -> None:
    try:
      self.proc.wait(timeout)
    finally:
      if self.proc.poll() is None:
        self.kill()
    self._thread.join(5)
    assert self.proc.returncode == 0 and "CAMPAIGN DONE" in self.lines, (
        "\n".join(self.lines[-40:]))


def _run_to_end(directory):
  run = _Run(directory)
  run.finish()
  return run.lines


def _fingerprints(directory):
  ckpt = os.path.join(directory, "golden", "checkpoints")
  out = {}
  for step in sorted((n for n in os.listdir(ckpt) if n.isdigit()), key=int):
    with open(os.path.join(ckpt, step, "meta", "metadata")) as f:
      out[int(step)] = json.load(f)["fingerprint"]
  return out


def _state(directory):
  """Everything a campaign recorded, as plain data."""
  d = str(directory)
  with open(os.path.join(d, "golden", "log.msgpack"), "rb") as f:
    log = list(msgpack.Unpacker(f, raw=False))
  return {
      "playback": profiler.read_records(os.path.join(d, "playback.msgpack")),
      "runtime": profiler.read_records(os.path.join(d, "runtime.msgpack")),
      "crashes": profiler.read_records(os.path.join(d, "crashes.msgpack")),
      "log": log, "checkpoints": _fingerprints(d)}


def _assert_same_records(got, want):
  assert got["checkpoints"] == want["checkpoints"]
  assert got["log"] == want["log"]
  assert got["crashes"] == want["crashes"]
  for name in ("playback", "runtime"):
    assert len(got[name]) == len(want[name]), name
    assert got[name] == want[name], name  # the same records, same order


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted campaign."""
  d = tmp_path_factory.mktemp("reference") / "campaign"
  _run_to_end(d)
  return d, _state(d)


def _kill_schedule(rng) -> list[tuple[str, float]]:
  """The kill points of one CYCLE with seeded delays."""
  return [(pattern, float(rng.uniform(0.0, longest)))
          for pattern, longest, count in CYCLE for _ in range(count)]


def _interrupted_campaign(directory, points):
  """Kills a campaign at each point, restarting it; then runs it to the end.

  Returns:
    ``[(pattern, delay, landed, phase at the kill, last line)]``.
  """
  tried = []
  for pattern, delay in points:
    run = _Run(directory)
    if run.wait_for(pattern, RUN_TIMEOUT_S):
      time.sleep(delay)
    landed = run.kill()
    tried.append((pattern, round(delay, 2), landed, run.phase(),
                  run.lines[-1][:90] if run.lines else ""))
  _run_to_end(directory)
  return tried


@pytest.mark.slow
def test_two_kill_points_recover_exactly(reference, tmp_path):
  d = tmp_path / "campaign"
  # The second point: right after the first runtime frequency is recorded,
  # while the second runs (a delay after "[3/4]" raced the now faster
  # runtime phase to its end).
  tried = _interrupted_campaign(d, [(r"playback step 0: \d+ sites", 0.0),
                                    (r"runtime every call: ", 0.0)])
  print("kill points (pattern, delay s, landed, phase, last line):", *tried,
        sep="\n")
  # The first lands after playback recorded step 0 (in playback, or in
  # runtime FI when the other steps were quicker than the kill).
  assert [t[2] for t in tried] == [True, True]
  assert tried[0][3] in ("playback", "runtime") and tried[1][3] == "runtime"
  _assert_same_records(_state(d), reference[1])


@pytest.mark.slow
def test_twenty_kill_points_across_phases_recover_exactly(reference,
                                                          tmp_path):
  """Campaigns killed at seeded points, restarted, completed, compared."""
  rng = np.random.default_rng(2024)
  tried, landed = [], []
  for cycle in range(MAX_CYCLES):
    d = tmp_path / f"campaign{cycle}"
    tried += _interrupted_campaign(d, _kill_schedule(rng))
    _assert_same_records(_state(d), reference[1])
    assert not os.path.exists(d / ".isolate")  # scratch of killed workers
    landed = [t for t in tried if t[2] and t[3] in PHASE_OF.values()]
    if len(landed) >= LANDED:
      break
  print("kill points (pattern, delay s, landed, phase, last line):", *tried,
        sep="\n")
  phases = {p: sum(t[3] == p for t in landed) for p in PHASE_OF.values()}
  print(f"{len(landed)} of {len(tried)} kill points landed in {cycle + 1} "
        f"campaigns; per phase: {phases}")
  assert len(landed) >= 20, tried
  assert min(phases.values()) >= 2, phases


@pytest.mark.slow
def test_same_seed_gives_bitwise_identical_record_files(reference, tmp_path):
  d = tmp_path / "again"
  _run_to_end(d)
  ref = reference[0]
  for name in ("playback.msgpack", "runtime.msgpack",
               os.path.join("golden", "log.msgpack")):
    assert (d / name).read_bytes() == (ref / name).read_bytes(), name
  assert _fingerprints(d) == _fingerprints(ref)
  assert len(profiler.read_records(d / "playback.msgpack")) == 3 * 2
