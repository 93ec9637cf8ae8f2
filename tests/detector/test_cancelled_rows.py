"""Rows that cancel whole: golden's dQ of the first query in causal attention.

With one visible key the softmax backward's dS row is exactly 0 and so is
golden's dQ row; another correct kernel (torch's SDPA backward computes
``D = rowsum(dO * O)`` instead of ``rowsum(P * dP)``) leaves residues of
the size of the tensor's rounding there. The decomposition must judge those
rows by the tensor's size (analyzer.signature._decompose.CANCELLED_ROW), and still
see a real value written into them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax import detector
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access

B, T, H, D = 2, 24, 4, 32


def _attention(q, k, v):
  s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D)
  s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30)
  return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v)


def _dq(q, k, v, do):
  return jax.vjp(_attention, q, k, v)[1](do)[0]


@pytest.fixture(scope="module")
def golden():
  rng = np.random.default_rng(7)
  q, k, v, do = (rng.standard_normal((B, T, H, D)).astype(np.float32)
                 for _ in range(4))
  g = np.asarray(jax.jit(_dq)(q, k, v, do))
  with jax.enable_x64():
    r = np.asarray(jax.jit(_dq)(*(x.astype(np.float64)
                                  for x in (q, k, v, do))))
  return (q, k, v, do), g, r


def _diag(t, g, r):
  ctx = {"kernel": "attention", "reduction": T}
  return cal.diagnose(jnp.asarray(t), jnp.asarray(g), jnp.asarray(r), ctx,
                      dtype=np.float32)


def test_golden_first_query_row_is_an_exact_cancellation(golden):
  _, g, r = golden
  assert np.all(g[:, 0] == 0) and np.all(r[:, 0] == 0)
  assert np.all(np.abs(g[:, 1:]).max(axis=-1) > 0)


def test_rounding_residues_in_cancelled_rows_pass(golden):
  """Residues of a few float32 ulps of the tensor's RMS, in row 0 only,
  over golden's own values elsewhere: reordering-level, not outliers."""
  _, g, r = golden
  rms = float(np.sqrt(np.mean(r * r)))
  rng = np.random.default_rng(11)
  t = g.copy()
  t[:, 0] = (rng.standard_normal(t[:, 0].shape) * 8 * 2.0 ** -24 * rms
             ).astype(np.float32)
  diag, sig = _diag(t, g, r), analyzer.analyze(
      jnp.asarray(t), jnp.asarray(g), jnp.asarray(r))
  assert int(sig.n_out) == 0, diag.evidence
  assert diag.verdict == "pass", (diag.model, diag.evidence)


def test_torch_sdpa_backward_passes(golden):
  """The real third-party kernel: torch's SDPA backward on the same
  inputs (its dQ row 0 holds residues where golden's is 0). It computes
  ``D = rowsum(dO * O)``: 1.4-1.9x golden's RMS error against float64 on
  eight seeds here, 2.0x on another x86-64 CPU whose XLA rounds golden
  more closely. It passes with a margin of 1.5 from the verdict's
  envelope and has no outliers."""
  torch = pytest.importorskip("torch")
  (q, k, v, do), g, r = golden
  qt, kt, vt = (torch.tensor(x.transpose(0, 2, 1, 3), requires_grad=True)
                for x in (q, k, v))
  out = torch.nn.functional.scaled_dot_product_attention(
      qt, kt, vt, attn_mask=torch.tril(torch.ones(T, T, dtype=torch.bool)))
  out.backward(torch.tensor(do.transpose(0, 2, 1, 3)))
  t = qt.grad.numpy().transpose(0, 2, 1, 3)
  diag = _diag(t, g, r)
  assert diag.verdict == "pass", (diag.model, diag.evidence)
  sig = analyzer.analyze(jnp.asarray(t), jnp.asarray(g), jnp.asarray(r))
  assert int(sig.n_out) == 0 and int(sig.n_beyond) == 0
  assert float(sig.noise_ratio) * 1.5 <= detector.BENIGN_NOISE_RATIO


@pytest.mark.parametrize("size", [1e-3, 1e-1])
def test_values_written_into_cancelled_rows_are_faults(golden, size):
  """A value where the row must be 0 (a stale or misplaced row), even at a
  thousandth of the tensor's RMS, stays beyond the envelope."""
  _, g, r = golden
  rms = float(np.sqrt(np.mean(r * r)))
  t = g.copy()
  t[0, 0, 1, :8] = np.float32(size * rms)
  diag = _diag(t, g, r)
  assert diag.verdict == "fail", (diag.model, diag.evidence)
  assert diag.model not in ("reordering", "exact", "precision")


# ------------------------------------------- bf16: rows that nearly cancel


#: The llama scenario's attention size (B 4 of its 8, T 64, 4 heads of 32).
B16, T16 = 4, 64


def _bf16_case(seed):
  """Causal attention in bf16: golden's dQ (jax.nn.dot_product_attention,
  a bf16 model's attention) and its float64 reference."""
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal((B16, T16, H, D)) for _ in range(3))
  do = 1e-3 * rng.standard_normal((B16, T16, H, D))
  att = lambda a, b, c: jax.nn.dot_product_attention(a, b, c, is_causal=True)
  args = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, do)]
  g = jax.vjp(att, *args[:3])[1](args[3])[0]
  with jax.enable_x64():
    r = np.asarray(jax.vjp(att, *(jnp.asarray(np.asarray(x, np.float64))
                                  for x in args[:3]))[1](
                                      jnp.asarray(np.asarray(args[3],
                                                             np.float64)))[0])
  return args, g, r


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_torch_sdpa_bf16_backward_passes(seed):
  """torch's SDPA backward in bf16 forms D = rowsum(dO * O) from the bf16
  output: rows that nearly cancel (the second query sees two keys) keep
  errors of u(bf16) x the tensor's RMS, 50-100 units of their own size.
  A 16-bit record sizes rows at least 1/4 of the tensor's RMS
  (ROW_FLOOR16): those are rounding, and the kernel passes."""
  torch = pytest.importorskip("torch")
  from peat_jax.analyzer.signature import _decompose  # pylint: disable=protected-access
  assert _decompose.ROW_FLOOR16 == 2.0 ** -2
  (q, k, v, do), g, r = _bf16_case(seed)
  tt = lambda x: torch.tensor(np.asarray(x, np.float32).transpose(
      0, 2, 1, 3)).to(torch.bfloat16)
  qt, kt, vt = (tt(x).requires_grad_(True) for x in (q, k, v))
  out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                         is_causal=True)
  out.backward(tt(do))
  t = jnp.asarray(qt.grad.float().numpy().transpose(0, 2, 1, 3),
                  jnp.bfloat16)
  diag = cal.diagnose(t, g, jnp.asarray(r), {"kernel": "attention",
                                             "reduction": T16},
                      dtype=jnp.bfloat16)
  assert diag.verdict == "pass", (diag.model, diag.evidence)
  assert diag.model in ("exact", "reordering"), diag.evidence


def test_a_value_in_a_nearly_cancelled_bf16_row_is_a_fault():
  """A tenth of the tensor's RMS written into the second query's dQ row
  stands beyond the envelope at the floor's size (1/32 of the RMS
  would not: in a 16-bit record that is rounding of the tensor's
  intermediates)."""
  _, g, r = _bf16_case(0)
  rms = float(np.sqrt(np.mean(r * r)))
  t = g.at[0, 1, 1, :8].set(jnp.bfloat16(0.1 * rms))
  diag = cal.diagnose(t, g, jnp.asarray(r), {"kernel": "attention",
                                             "reduction": T16},
                      dtype=jnp.bfloat16)
  assert diag.verdict == "fail", (diag.model, diag.evidence)
  assert diag.model not in ("reordering", "exact", "precision")
