"""--invariance in peat-playback and peat-validate, on the tiny task of
conftest.py."""

from peat_jax import profiler
from peat_jax.tools import playback


def test_playback_tool_probes_the_sites(profiled_copy, cli):
  campaign = profiled_copy
  rc, out, err = cli.run(playback, [f"--campaign_dir={campaign}",
                                    f"--kut={cli.kut}", "--checkpoints=0",
                                    "--invariance"])
  assert rc == 0, err
  recs = [r for r in profiler.read_records(campaign / "playback.msgpack")
          if r.get("kind") == "site" and r["step"] == 0]
  probed = [r for r in recs if "invariance" in r]
  assert probed and probed[0]["site"] == cli.dense
  facts = probed[0]["invariance"]
  # The native kernel with bf16 inputs: no write into its inputs, none of
  # an earlier call's values, every moved output follows its input.
  assert facts["mutation"] == []
  out0 = facts["outputs"][0]
  assert out0["reuse"]["from_earlier"] == 0
  assert out0["insensitive"]["still"] == 0
  assert probed[0]["diagnosis"]["model"] == "precision:bf16"


def test_ops_playback_refuses_the_checks(profiled, cli):
  d, _ = profiled
  rc, _, err = cli.run(playback, [f"--campaign_dir={d}", "--ops",
                                  "--invariance"])
  assert rc == 2 and "--invariance probes the KUT" in err
