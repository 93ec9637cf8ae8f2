"""The report's training-level statements, in words.

* the training-level significance of runtime FI runs (each run's
  ``significance``: its weight distance to the golden trajectory in units
  of the seed-to-seed distance and of a bf16-proxy run), and its part in
  the verdict: a KUT that moves the weights beyond the bf16 proxy warns
  (:func:`peat_jax.detector.weights_verdict`);
* sites whose noise ratio rises over the checkpoints
  (:func:`peat_jax.detector.noise_trend`);
* what a verdict covers (the campaign's ``provenance``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from peat_jax import detector as _detector


def _x(v: float) -> str:
  return f"{v:.2g}x"


def _proxy_words(sig: Mapping) -> str:
  proxy = sig.get("proxy") or "bf16"
  return {"bf16": "bf16 training",
          "fp8_e4m3": "fp8 (e4m3, per-tensor scaled) training",
          "bf16+fp8_e4m3": "training one format below (float32 matmuls at "
                           "bf16, 16-bit ones at fp8 e4m3)"}.get(
                               proxy, f"{proxy} training")


def significance_sentence(sig: Mapping) -> str:
  """A run's significance in words.

  Args:
    sig: a runtime run's ``significance`` (docs/report.md).

  Returns:
    e.g. ``moves the weights 0.3x as much as bf16 training, 1.4x the
    seed-to-seed distance (Wasserstein-1 of the weight values at step
    40)``; a bf16 model's yardstick is fp8 training (``proxy``).
  """
  parts = []
  if sig.get("vs_bf16") is not None:
    parts.append(f"{_x(sig['vs_bf16'])} as much as {_proxy_words(sig)}")
  if sig.get("vs_seed") is not None:
    parts.append(f"{_x(sig['vs_seed'])} the seed-to-seed distance")
  if not parts:
    return (f"has no yardstick for its weight distance at step "
            f"{sig['step']} (neither the seed runs nor the precision proxy "
            "were measured)")
  return (f"moves the weights {', '.join(parts)} (Wasserstein-1 of the "
          f"weight values at step {sig['step']})")


def _strongest(runs: Sequence[Mapping]) -> Mapping | None:
  """The run that moves the weights most in units of the precision proxy
  (else of the seed distance)."""
  withsig = [r for r in runs or () if r.get("significance")]
  if not withsig:
    return None

  def key(r):
    s = r["significance"]
    return (s.get("vs_bf16") is not None,
            s.get("vs_bf16") if s.get("vs_bf16") is not None else -1.0,
            s.get("vs_seed") if s.get("vs_seed") is not None else -1.0)

  return max(withsig, key=key)


def with_significance(verdict: dict, runs: Sequence[Mapping] | None,
                      benign_warn: bool = False) -> dict:
  """The verdict with the runtime runs' significance added.

  The summary gains a sentence on the run that moves the weights most; when
  any run moves them beyond the precision proxy a ``pass`` becomes
  ``warn`` (``warn`` and ``fail`` stay) and that run joins the deciding
  records as ``["runtime <frequency>", step]``. A ``warn`` that only
  benign records decided (``benign_warn``: ``reordering`` beyond the
  golden kernel's noise envelope) becomes ``pass`` when every run moves
  the weights at most :data:`peat_jax.detector.BENIGN_TRAINING_LIMIT` of
  the proxy (:func:`peat_jax.detector.benign_far_below`); the summary
  states the ratio. Without runtime runs nothing changes.

  Args:
    verdict: the report's ``verdict`` mapping (from playback records and
      findings).
    runs: the report's ``runtime`` runs (None: none).
    benign_warn: the playback verdict is ``warn`` and every warning record
      is ``exact`` or ``reordering`` with no other cause beside it.

  Returns:
    A new ``verdict`` mapping.
  """
  top = _strongest(runs or ())
  if top is None:
    return verdict
  sig = top["significance"]
  sigs = [r["significance"] for r in runs if r.get("significance")]
  beyond = [r for r in runs if r.get("significance") and
            _detector.weights_verdict(r["significance"].get("vs_bf16"))
            == "warn"]
  sentence = (f"Runtime FI ({top['frequency']}): the KUT "
              f"{significance_sentence(sig)}")
  out = dict(verdict)
  if (benign_warn and verdict["verdict"] == "warn" and not beyond
      and _detector.benign_far_below([s.get("vs_bf16") for s in sigs])):
    out["verdict"] = "pass"
    out["summary"] = (
        f"pass: the warning records are benign (another order of the same "
        f"arithmetic, beyond the golden kernel's noise envelope) and "
        f"training does not feel them: {sentence}, at most "
        f"{_x(_detector.BENIGN_TRAINING_LIMIT)} of the proxy. Playback "
        f"records: {verdict['summary']}")
    out["deciding"] = []
    out["benign_note"] = (
        f"benign records pass on training evidence: every runtime run moves "
        f"the weights at most {_x(max(s['vs_bf16'] for s in sigs))} as much "
        f"as {_proxy_words(sig)} (limit "
        f"{_x(_detector.BENIGN_TRAINING_LIMIT)})")
    return out
  if not beyond:
    out["summary"] = f"{verdict['summary']}. {sentence}"
    return out
  where = [[f"runtime {r['frequency']}", r["significance"]["step"]]
           for r in beyond]
  sentence += (f", beyond the {sig.get('proxy') or 'bf16'} proxy (limit "
               f"{_x(_detector.BF16_PROXY_LIMIT)})")
  if verdict["verdict"] == "pass":
    out["verdict"] = "warn"
    out["summary"] = (f"warn: {sentence}. Playback records: "
                      f"{verdict['summary']}")
    out["deciding"] = where
  else:
    out["summary"] = f"{verdict['summary']}. {sentence}"
    out["deciding"] = (list(verdict.get("deciding") or []) + where)[:50]
  return out


def site_trends(sites: Sequence[Mapping]) -> list[dict]:
  """The noise-ratio trend of every site (:func:`detector.noise_trend`)."""
  return [_detector.noise_trend(s.get("steps") or [],
                                s.get("noise_ratio") or []) for s in sites]


def trend_sentence(site: Mapping) -> str | None:
  """``"<site>'s noise ratio rises 3.1x from step 0 to step 40"`` for a
  site whose ``noise_trend`` rises, else None."""
  t = site.get("noise_trend") or {}
  if not t.get("rises"):
    return None
  return (f"{site['site']}: noise ratio rises {_x(t['factor'])} from step "
          f"{t['from_step']} to step {t['to_step']} (at least "
          f"{_x(t['factor_loo'])} with any one step left out)")


def covers_sentence(prov: Mapping) -> str:
  """What a verdict covers, from the report's ``provenance``."""
  kut = prov["kut"]
  content = kut.get("content") or {}
  digest = (f" (content sha256 {content['sha256'][:16]}...)"
            if content.get("sha256") else "")
  plat = prov.get("platform") or {}
  vers = prov.get("versions") or {}
  where = (f"{plat.get('backend', '?')} ({plat.get('device_kind', '?')} x"
           f"{plat.get('device_count', '?')})" if plat else
           "an unrecorded platform")
  flags = vers.get("xla_flags") or []
  versions = (f"jax {vers.get('jax', '?')} / jaxlib {vers.get('jaxlib', '?')}"
              f", XLA flags {' '.join(flags) if flags else 'none'}"
              if vers else "unrecorded versions")
  sites = prov.get("sites") or []
  shapes = {(s.get("kernel"), site_inputs(s)) for s in sites
            if s.get("in_shapes") is not None}
  steps = prov.get("checkpoint_steps") or []
  freqs = prov.get("frequencies") or []
  return (f"A pass covers exactly this and nothing else: KUT {kut['spec']}"
          f"{digest}, on {where} with {versions}, at {len(sites)} site"
          f"{'s' if len(sites) != 1 else ''} in phase"
          f"{'s' if len(prov.get('phases') or []) != 1 else ''} "
          f"{', '.join(prov.get('phases') or []) or 'none'}"
          f"{backward_words(prov)} with the input "
          f"shapes and dtypes listed ({len(shapes)} distinct kernel "
          f"signatures), at checkpoint "
          f"steps {steps or 'none'}, and in runtime FI at "
          f"{', '.join(freqs) if freqs else 'no frequency'}. Other shapes, "
          "dtypes, sites, phases, training states, platforms or versions "
          "were not exercised.")


def backward_words(prov: Mapping) -> str:
  """What ran at the backward sites, e.g. ``" (the KUT's VJP at the
  backward sites)"``; empty when the provenance does not say."""
  return {"kut": " (the KUT's VJP at the backward sites)",
          "golden": " (the golden kernel at the backward sites)"}.get(
              prov.get("backward"), "")


def _shape(dtype: str, shape: Sequence[int]) -> str:
  return f"{dtype}[{','.join(str(d) for d in shape)}]"


def site_inputs(site: Mapping) -> str:
  """A provenance site's inputs, e.g. ``float32[16,64] float32[64,10]``."""
  shapes, dtypes = site.get("in_shapes"), site.get("in_dtypes")
  if shapes is None:
    return "inputs not recorded"
  return " ".join(_shape(d, s) for s, d in zip(shapes, dtypes or
                                               ["?"] * len(shapes)))


def provenance_lines(prov: Mapping) -> list[str]:
  """The provenance as lines of the plain-text summary."""
  kut = prov["kut"]
  content = kut.get("content") or {}
  files = ", ".join(f["path"].rsplit("/", 1)[-1]
                    for f in content.get("files") or [])
  lines = [f"KUT {kut['spec']} (source {kut.get('source', '?')}"
           + (f"; {files} sha256 {content['sha256']}" if content.get("sha256")
              else "") + ")"]
  plat, vers = prov.get("platform") or {}, prov.get("versions") or {}
  if plat:
    lines.append(
        f"platform {plat.get('backend')} ({plat.get('device_kind')} x"
        f"{plat.get('device_count')}), {plat.get('cores_visible')} cores "
        f"visible, {plat.get('system')} {plat.get('machine')}, Python "
        f"{plat.get('python')}")
  else:
    lines.append("platform: not recorded")
  if vers:
    libs = ", ".join(f"{k} {v}" for k, v in vers.items()
                     if isinstance(v, str))
    flags = vers.get("xla_flags") or []
    lines.append(f"versions {libs}; XLA flags: "
                 f"{' '.join(flags) if flags else 'none'}")
  else:
    lines.append("versions: not recorded")
  for s in prov.get("sites") or []:
    lines.append(f"site {s['site']}: {site_inputs(s)}")
  lines.append(f"phases {', '.join(prov.get('phases') or []) or 'none'}"
               f"{backward_words(prov)}; "
               f"checkpoint steps {prov.get('checkpoint_steps') or []}; "
               f"runtime FI: {', '.join(prov.get('frequencies') or []) or 'none'}")
  lines.append(covers_sentence(prov))
  return lines
