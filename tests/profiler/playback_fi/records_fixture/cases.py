"""Small playback campaigns whose records must not change (issue 22).

Shared by the fixture's generator (``make.py``, run once with peat_jax at
main 3ff0694, before playback was made faster) and by
tests/profiler/playback_fi/test_playback_records_fixed.py, which plays the same
campaigns with today's peat_jax and compares ``playback.msgpack`` byte for
byte. The golden runs are made by the test itself (golden training is
bitwise deterministic on one machine type: same core count, same bits);
only the record files are stored.

Each case: the scenario of ``peat_jax.models`` with small overrides, the
golden run's length, and the playback call (one KUT or several, backward
setting).
"""

CASES = {
    # The real CNN on the 8x8 digits: three convolution sites.
    "cnn_conv2d": dict(scenario="cnn", overrides={}, steps=4,
                       kuts=["native:conv2d:in_bf16"], backward="golden"),
    # A small GPT: matmul sites (forward), scan-free, one block.
    "gpt_matmul": dict(
        scenario="gpt",
        overrides=dict(batch_size=2, context=16,
                       model_kwargs=dict(dim=32, depth=1, heads=2)),
        steps=4, kuts=["native:matmul:in_bf16"], backward="golden"),
    # Composite sites (host references) and two KUTs played together.
    "gpt_many": dict(
        scenario="gpt",
        overrides=dict(batch_size=2, context=16,
                       model_kwargs=dict(dim=32, depth=1, heads=2)),
        steps=4, kuts=["native:softmax:in_bf16", "native:layer_norm:in_bf16",
                       "native:matmul:acc_bf16"], backward="golden"),
    # The KUT's VJP at the backward sites.
    "gpt_backward_kut": dict(
        scenario="gpt",
        overrides=dict(batch_size=2, context=16,
                       model_kwargs=dict(dim=32, depth=1, heads=2)),
        steps=4, kuts=["native:matmul:in_bf16"], backward="kut"),
}


def run(peat, models, name, workdir, replay_golden_step=True):
  """Plays case ``name`` into ``workdir``; returns the record file's path.

  The fixture's records replay the golden step at each checkpoint (as
  playback did before the golden run stored it): ``replay_golden_step``
  False plays the KUT's step alone against the stored golden step."""
  import os  # pylint: disable=g-import-not-at-top

  c = CASES[name]
  task = models.get_task(c["scenario"], **c["overrides"])
  g = peat.golden_train(task, os.path.join(workdir, "golden"),
                        steps=c["steps"], checkpoint_every=2, evaluate=False)
  d = os.path.join(workdir, "campaign")
  mode = dict(backward=c["backward"], replay_golden_step=replay_golden_step)
  if len(c["kuts"]) == 1:
    peat.playback(task, g.workdir, c["kuts"][0], campaign_dir=d, **mode)
  else:
    peat.playback_many(task, g.workdir, c["kuts"], campaign_dir=d, **mode)
  return os.path.join(d, peat.profiler.PLAYBACK_FILE)
