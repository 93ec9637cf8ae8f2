"""Corrupt state: record files, a full disk, settings of another version,
captured inputs. Each error names the file and the fix; nothing already
recorded is lost (issue 10, part 3)."""

import errno
import json
import os
import struct

import numpy as np
import pytest

import peat_jax as peat
from peat_jax.profiler.campaigns import _campaign as C
from peat_jax.profiler.capture import _capture_io as _capture_io
from peat_jax.profiler.files import _records as R


def _records(rng, n):
  """Seeded record dicts shaped like playback records (nested, floats)."""
  return [{"kind": "site", "step": int(i), "site": f"fwd/x/dot_general:{i}",
           "signature": {"rel_rms": float(rng.normal()),
                         "ulp_hist": rng.integers(0, 99, 8).tolist()},
           "diagnosis": {"model": "reordering", "verdict": "pass"}}
          for i in range(n)]


@pytest.fixture
def rec_file(tmp_path):
  rng = np.random.default_rng(1234)
  recs = _records(rng, 5)
  path = str(tmp_path / "playback.msgpack")
  R.append_records(path, recs[:2])
  R.append_records(path, recs[2:])
  return path, recs


def _frame_starts(path):
  data = open(path, "rb").read()
  starts, pos = [], 0
  while pos < len(data):
    starts.append(pos)
    pos += 6 + struct.unpack(">I", data[pos + 1:pos + 5])[0]
  return data, starts


def test_round_trip_and_plain_msgpack_compatibility(rec_file):
  import msgpack
  path, recs = rec_file
  assert R.read_records(path) == recs
  # Any msgpack reader parses the file: one ext object per record.
  objs = list(msgpack.Unpacker(open(path, "rb")))
  assert [o.code for o in objs] == [R.EXT_TYPE] * len(recs)


@pytest.mark.parametrize("cut", [1, 5, 6, 20])
def test_torn_last_record_is_dropped_then_truncated_on_append(rec_file, cut):
  path, recs = rec_file
  extra = R.pack_record({"kind": "effect", "step": 9})
  with open(path, "ab") as f:
    f.write(extra[:cut])  # a crash mid-append
  assert R.read_records(path) == recs
  new = {"kind": "effect", "step": 10}
  R.append_records(path, [new])  # the torn bytes go first
  assert R.read_records(path) == recs + [new]
  assert os.path.getsize(path) == sum(len(R.pack_record(r))
                                      for r in recs + [new])


def _flip_payload(data, starts):
  b = bytearray(data)
  b[starts[2] + 12] ^= 0x04
  return bytes(b)


def _huge_length(data, starts):
  b = bytearray(data)
  b[starts[1] + 1:starts[1] + 5] = struct.pack(">I", 10**6)
  return bytes(b)


def _short_length(data, starts):
  b = bytearray(data)
  n = struct.unpack(">I", data[starts[1] + 1:starts[1] + 5])[0]
  b[starts[1] + 1:starts[1] + 5] = struct.pack(">I", n - 3)
  return bytes(b)


def _bad_marker(data, starts):
  b = bytearray(data)
  b[starts[3]] = 0x91  # a fixarray where a frame starts
  return bytes(b)


def _garbage_inserted(data, starts):
  return data[:starts[2]] + b"\x00\x01\x02" + data[starts[2]:]


def _other_ext_type(data, starts):
  b = bytearray(data)
  b[starts[1] + 5] = 0x51
  return bytes(b)


@pytest.mark.parametrize("damage,good", [
    (_flip_payload, 2), (_huge_length, 1), (_short_length, 1),
    (_bad_marker, 3), (_garbage_inserted, 2), (_other_ext_type, 1)])
def test_corruption_in_the_middle_is_an_error_naming_the_file(rec_file,
                                                              damage, good):
  path, recs = rec_file
  data, starts = _frame_starts(path)
  bad = damage(data, starts)
  with open(path, "wb") as f:
    f.write(bad)
  with pytest.raises(R.RecordFileError,
                     match=rf"record file {path} is corrupt at byte \d+ .*"
                     r"good records.*Fix:.*repair_records"):
    R.read_records(path)
  # Appending refuses too, and nothing was changed.
  with pytest.raises(R.RecordFileError, match="is corrupt"):
    R.append_records(path, [{"kind": "x"}])
  assert open(path, "rb").read() == bad
  assert isinstance(R.RecordFileError("x"), peat.PeatError)
  # The documented fix keeps every good record before the damage.
  assert R.repair_records(path) == good
  assert R.read_records(path) == recs[:good]
  assert open(path + ".corrupt", "rb").read() == bad


def _failing_write(monkeypatch, after_bytes, code=errno.ENOSPC):
  """os.write in _records writes ``after_bytes`` bytes, then fails."""
  real = os.write
  left = [after_bytes]

  def write(fd, data):
    if left[0] <= 0:
      raise OSError(code, os.strerror(code))
    n = real(fd, bytes(data[:left[0]]))
    left[0] -= n
    return n
  monkeypatch.setattr(R.os, "write", write)


@pytest.mark.parametrize("after_bytes", [0, 7, 50])
def test_enospc_during_append_keeps_earlier_records(rec_file, monkeypatch,
                                                    after_bytes):
  path, recs = rec_file
  size = os.path.getsize(path)
  _failing_write(monkeypatch, after_bytes)
  with pytest.raises(R.RecordFileError,
                     match=rf"cannot append 2 records to record file {path}"
                     r": No space left on device \(ENOSPC\).*intact.*Fix: "
                     r"free disk space.*resumes"):
    R.append_records(path, [{"kind": "effect", "step": 1},
                            {"kind": "effect", "step": 2, "pad": "x" * 40}])
  assert os.path.getsize(path) == size
  assert R.read_records(path) == recs
  monkeypatch.undo()  # space again: the next append works
  R.append_records(path, [{"kind": "effect", "step": 3}])
  assert R.read_records(path) == recs + [{"kind": "effect", "step": 3}]


def test_enospc_during_rewrite_leaves_file_unchanged(rec_file, monkeypatch):
  path, recs = rec_file
  before = open(path, "rb").read()

  class Full:
    def __init__(self, *a, **k):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(R, "open", Full, raising=False)
  with pytest.raises(R.RecordFileError, match=rf"rewrite record file {path}.*"
                     r"ENOSPC.*not changed"):
    R.rewrite_records(path, recs[:1])
  monkeypatch.undo()
  assert open(path, "rb").read() == before
  assert not os.path.exists(path + ".tmp")


def _fake_task():
  """A TrainTask whose callables must never run (settings are checked
  before any training)."""
  def never(*a, **k):
    raise AssertionError("the campaign ran past its settings check")
  return peat.TrainTask(name="fake", config={"k": 1}, init_state=never,
                        step_fn=never, train_step=never, batch_at=never,
                        evaluate=never, default_steps=4,
                        default_checkpoint_every=2, model_fn=never)


@pytest.mark.parametrize("stored", [
    {"scenario": "fake", "kut": "golden"},          # before format versions
    {"format": 1, "scenario": "fake", "kut": "golden"},
    {"format": C.CAMPAIGN_FORMAT + 1, "kut": "golden"},
])
def test_campaign_of_another_version_is_refused(tmp_path, stored):
  d = tmp_path / "campaign"
  d.mkdir()
  (d / "campaign.json").write_text(json.dumps(stored))
  R.append_records(str(d / R.PLAYBACK_FILE), [{"kind": "effect", "step": 0}])
  before = {p.name: p.read_bytes() for p in d.iterdir()}
  with pytest.raises(peat.PeatError,
                     match=rf"{d} was written by another version of peat_jax"
                     rf": {d}/campaign.json has campaign format "
                     rf"{stored.get('format')!r}.*reads format "
                     rf"{C.CAMPAIGN_FORMAT}.*Nothing was changed. Fix: run "
                     "the campaign in a new directory"):
    C.validate(_fake_task(), "golden", d, frequencies=(), progress=None)
  assert {p.name: p.read_bytes() for p in d.iterdir()
          if p.name != ".lock"} == before


def test_corrupt_settings_file_is_named(tmp_path):
  d = tmp_path / "campaign"
  d.mkdir()
  (d / "campaign.json").write_text('{"format": 2, "kut": ')
  with pytest.raises(peat.PeatError,
                     match=rf"campaign settings file {d}/campaign.json is "
                     "corrupt.*Nothing was changed"):
    C.validate(_fake_task(), "golden", d, frequencies=(), progress=None)


def test_settings_write_enospc_is_clear(tmp_path, monkeypatch):
  d = tmp_path / "campaign"
  real_dump = json.dump

  def full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(C.json, "dump", full)
  with pytest.raises(peat.PeatError, match=rf"cannot write campaign settings "
                     rf"file {d}/campaign.json: No space left.*free disk"):
    C.validate(_fake_task(), "golden", d, frequencies=(), progress=None)
  monkeypatch.setattr(C.json, "dump", real_dump)
  assert not (d / "campaign.json").exists()
  assert not (d / "campaign.json.tmp").exists()


@pytest.fixture
def capture(tmp_path):
  rng = np.random.default_rng(7)
  arrays = {"in0": rng.normal(size=(4, 6)).astype(np.float32),
            "out0": rng.normal(size=(4, 3)).astype(np.float32)}
  data, meta = _capture_io.record_bytes(arrays)
  entry = {"file": "step_0/site.npz", "bytes": len(data), "arrays": meta,
           "site": "fwd/x/dot_general:0", "step": 0}
  _capture_io.write_file(str(tmp_path / entry["file"]), data)
  return str(tmp_path), entry, arrays


def test_captured_inputs_round_trip(capture):
  d, entry, arrays = capture
  got = _capture_io.load_record(d, entry)
  for k, v in arrays.items():
    np.testing.assert_array_equal(got[k], v)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_captured_inputs_name_the_file(capture, damage):
  d, entry, _ = capture
  path = os.path.join(d, entry["file"])
  data = bytearray(open(path, "rb").read())
  if damage == "truncate":
    data = data[:len(data) // 2]
  elif damage == "flip":
    data[len(data) - 200] ^= 0x40  # inside the last array's values
  if damage == "delete":
    os.remove(path)
  else:
    open(path, "wb").write(bytes(data))
  with pytest.raises(peat.PeatError, match=rf"capture file {path} .*Fix:"):
    _capture_io.load_record(d, entry)
