"""dot_general sites whose result is wider than their operands (a bf16
model's attention logits: bf16 operands, float32 result): the native
adapter and the split-K port return the site's dtype at its precision,
not a bf16 result cast up (a false precision:bf16 warning at every such
site of llama before)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.kernels import _adapters  # pylint: disable=protected-access
from peat_jax.kernels import ports

DN = (((1,), (0,)), ((), ()))


def _operands(seed):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((24, 96)), jnp.bfloat16),
          jnp.asarray(rng.standard_normal((96, 37)), jnp.bfloat16))


@pytest.mark.parametrize("kut", [
    lambda a, b: _adapters.dot_general_adapter(
        a, b, dimension_numbers=DN, preferred_element_type=jnp.float32),
    lambda a, b: ports.dot_general_split_k_edge(
        a, b, dimension_numbers=DN, preferred_element_type=jnp.float32)],
                         ids=["native", "split_k_edge"])
@pytest.mark.parametrize("seed", [3, 4])
def test_a_wider_result_keeps_its_precision(kut, seed):
  a, b = _operands(seed)
  ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  g = jax.lax.dot_general(a, b, DN, preferred_element_type=jnp.float32)
  t = kut(a, b)
  assert t.dtype == jnp.float32
  scale = np.sqrt(np.mean(ref * ref))
  err_t = np.max(np.abs(np.asarray(t, np.float64) - ref)) / scale
  err_g = np.max(np.abs(np.asarray(g, np.float64) - ref)) / scale
  # float32 accumulation: within a few times golden's error, far below
  # one bf16 rounding of the result (2**-9 relative).
  assert err_t <= 4 * err_g + 1e-6 and err_t < 2.0 ** -12, (err_t, err_g)
  # Not every value is a bf16 value (a bf16 result cast up would be).
  tb = np.asarray(t).astype(jnp.bfloat16).astype(np.float32)
  assert np.mean(tb == np.asarray(t)) < 0.5
