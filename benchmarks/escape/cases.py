"""The escape suite's defects and controls (benchmarks/escape_suite.py).

Each :class:`Case` is a kernel under test with its unit test (a
:class:`protocols.Problem`: KernelBench's problem of that kernel at a size
this 2-core CPU runs in seconds, its own input layout) and the training
scenario where that kernel lives, played back by ``peat.validate``. The
defects reproduce documented failure modes that passed random-input tests
(docs/kernels.md, "The escape suite", cites each); the controls are
correct kernels and must pass everywhere.

The shape-gated defects (:data:`SHAPE_DEFECTS`,
``benchmarks/escape/escape_shapes.py``) have their bug on a path the
training shapes do not take: training-shape playback passes them (the
shapes are not exercised), ``--fuzz`` (``peat.fuzz`` on variants of a
site's captured real inputs) catches and names them, and the regression
test ``peat.export_repro`` writes of the exposing variant fails on them and
passes on their ``fixed`` twin.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax

from protocols import Problem
from peat_jax.models import layers


class Case(NamedTuple):
  """One row of the escape suite.

  Attributes:
    name: the row's name.
    kind: ``defect`` or ``control``.
    spec: the KUT spec (``{lib}``: the escape library's path).
    kernel: the site kernel of a ``py:``/``ffi:`` spec (None otherwise).
    scenario: a key of :data:`SCENARIOS`.
    backward: ``peat.validate``'s ``backward``.
    select: narrow the sites (``fnmatch`` pattern) or None.
    expected: the error-model family a defect should get (the training
      records' for the first rows, the fuzz records' for the shape-gated
      ones, whose training verdict is ``pass``), ``pass`` for a control.
    home: where the bug lives: ``C++`` (a kernel's), ``JAX`` (a
      formula's), or the control's origin.
    precedent: the real-world failure it reproduces.
    problem: its unit test.
    fixed: a shape-gated defect's fixed twin (a KUT spec of the same site
      kernel), the exported repro's "after"; None for the other rows.
  """

  name: str
  kind: str
  spec: str
  kernel: str | None
  scenario: str
  backward: str
  select: str | None
  expected: str
  home: str
  precedent: str
  problem: Problem
  fixed: str | None = None


#: scenario -> (model scenario, config overrides, golden steps, every).
SCENARIOS = {
    "cnn": ("cnn", {"batch_size": 8}, 20, 10),
    "gpt": ("gpt", {"batch_size": 2, "context": 40}, 20, 10),
    "gpt_long": ("gpt", {"batch_size": 2, "context": 40}, 150, 50),
}

_MM = (((1,), (0,)), ((), ()))
_BMM = (((2,), (1,)), ((0,), (0,)))


def _dot(dn):
  return (lambda kut, a, b: kut(a, b, dimension_numbers=dn, precision=None,
                                preferred_element_type=None,
                                out_sharding=None),
          lambda a, b: lax.dot_general(a, b, dn))


_call, _gold = _dot(_MM)
MATMUL = Problem(
    "KernelBench L1 #1 square matmul (N=256)", ((256, 256), (256, 256)),
    _call, _gold,
    ((((256, 256), (256, 256)), 1), (((256, 256), (256, 256)), 2),
     (((128, 384), (384, 64)), 3)))
_bcall, _bgold = _dot(_BMM)
BMM = Problem(
    "KernelBench L1 #3 batched matmul (8x64x128x64)",
    ((8, 64, 128), (8, 128, 64)), _bcall, _bgold,
    ((((8, 64, 128), (8, 128, 64)), 1), (((8, 64, 128), (8, 128, 64)), 2),
     (((4, 32, 256), (4, 256, 48)), 3)))
ATTENTION = Problem(
    "KernelBench L1 #97 scaled dot-product attention (B=2, T=64, H=4, "
    "D=32)", ((2, 64, 4, 32),) * 3,
    lambda kut, q, k, v: kut(q, k, v), layers.attention,
    ((((2, 64, 4, 32),) * 3, 1), (((2, 64, 4, 32),) * 3, 2),
     (((1, 128, 2, 64),) * 3, 3)))
SOFTMAX = Problem(
    "KernelBench L1 #23 softmax (16x16384)", ((16, 16384),),
    lambda kut, x: kut(x), lambda x: jax.nn.softmax(x, axis=-1),
    ((((16, 16384),), 1), (((16, 16384),), 2), (((64, 4096),), 3)))
GELU = Problem(
    "KernelBench L1 #26 GELU (16x16384)", ((16, 16384),),
    lambda kut, x: kut(x), lambda x: jax.nn.gelu(x, approximate=False),
    ((((16, 16384),), 1), (((16, 16384),), 2), (((64, 4096),), 3)))
LAYER_NORM = Problem(
    "KernelBench L1 #40 LayerNorm (4x4x16384, over the last axis; "
    "KernelBench normalizes 64x256x256 features a row)", ((4, 4, 16384),),
    lambda kut, x: kut(x, jax.numpy.ones((x.shape[-1],)),
                       jax.numpy.zeros((x.shape[-1],)), 1e-5),
    lambda x: layers.layer_norm(x, jax.numpy.ones((x.shape[-1],)),
                                jax.numpy.zeros((x.shape[-1],)), 1e-5),
    ((((4, 4, 16384),), 1), (((4, 4, 16384),), 2), (((8, 8, 4096),), 3)))
MAX = Problem(
    "KernelBench L1 #49 max over a dim (16x256x256, dim 1)",
    ((16, 256, 256),), lambda kut, x: kut(x, axes=(1,)),
    lambda x: lax.reduce_max(x, (1,)),
    ((((16, 256, 256),), 1), (((16, 256, 256),), 2),
     (((8, 128, 512),), 3)))

_LIB = "ffi:{lib}:"

DEFECTS = (
    Case("backward_dq_mask", "defect",
         _LIB + "EscAttention:EscAttentionBwdDqNoMask", "attention", "gpt",
         "kut", None, "unknown", "C++",
         "TransformerEngine issue 3216: exact forward, dQ wrong only with "
         "several sequences (a mask) per batch", ATTENTION),
    Case("padded_tail", "defect",
         _LIB + "EscAttentionWs:EscAttentionBwdTail", "attention", "gpt",
         "kut", None, "stale", "C++",
         "flash-attention PR 2896: padded dQ accumulator tail never written",
         ATTENTION),
    Case("strided_batch", "defect", "py:escape_jax:dot_general_by_stride",
         "dot_general", "gpt", "golden", "*attention/dot_general*",
         "indexing", "JAX",
         "flash-attention issue 2541: strided q/k/v views of a fused QKV "
         "projection mishandled", BMM),
    Case("cached_output", "defect", _LIB + "EscMatmulCached:EscMatmulBwd",
         "dot_general", "cnn", "golden", None, "stale", "C++",
         "KernelBench-generated kernels: output cached by input address",
         MATMUL),
    Case("input_zeroing", "defect", _LIB + "EscMatmulZeroInput:EscMatmulBwd",
         "dot_general", "cnn", "golden", None, "input_mutation", "C++",
         "KernelBench-generated kernels: inputs zeroed so the reference "
         "run after agrees", MATMUL),
    Case("subsampled_reduction", "defect",
         _LIB + "EscMatmulSubsample:EscMatmulSubsampleBwd", "dot_general",
         "cnn", "golden", None, "input_insensitive", "C++",
         "KernelBench-generated kernels: a reduction over a subsample",
         MATMUL),
    Case("sign_bug", "defect", "py:escape_jax:gelu_abs_erf", "gelu", "gpt",
         "golden", None, "unknown", "JAX",
         "a sign bug invisible on non-negative uniform inputs (erf on |z|)",
         GELU),
    Case("running_max_zero", "defect", "py:escape_jax:reduce_max_from_zero",
         "reduce_max", "gpt", "golden", None, "zero", "JAX",
         "a running max started at 0 instead of -inf", MAX),
    Case("batch_variant_split", "defect",
         _LIB + "EscMatmulBatchSplit:EscMatmulBwd", "dot_general", "cnn",
         "golden", None, "batch_variance", "C++",
         "split-K chosen from the batch size: batch-variant results, the "
         "main cause of nondeterministic LLM inference", MATMUL),
    Case("late_fp16_overflow", "defect", _LIB + "EscSoftmaxF16:EscSoftmaxBwd",
         "softmax", "gpt_long", "golden", None, "nan", "C++",
         "fp16 intermediates that overflow once activations grow (FP8 "
         "training diverging late)", SOFTMAX),
)

_SHAPES = "py:escape_shapes:"


def _shape_case(fn: str, kernel: str, expected: str, precedent: str,
                problem: Problem, scenario: str = "gpt") -> Case:
  return Case(fn, "defect", _SHAPES + fn, kernel, scenario, "golden", None,
              expected, "JAX (shape-gated)", precedent, problem,
              fixed=_SHAPES + fn + "_fixed")


#: Bugs on shapes the ``gpt`` training run never takes (escape_shapes.py's
#: docstring): ``expected`` is the family the fuzz records get.
SHAPE_DEFECTS = (
    _shape_case("softmax_tail64", "softmax", "scale",
                "rows of L % 128 == 64 count their half-full last vector "
                "twice (tenstorrent/tt-metal issue 4599, PR 20008)",
                SOFTMAX),
    _shape_case("softmax_tail64_long", "softmax", "scale",
                "rows of L % 128 == 64, L > 64, leave their last 64 values "
                "out of the sum (the % 128 == 64 lengths of pytorch issue "
                "196678)", SOFTMAX),
    _shape_case("matmul_ntail7", "dot_general", "indexing",
                "N % 8 == 7: the epilogue's last lane repeats the one "
                "before (a vector-tail slip in a GEMM epilogue)", MATMUL),
    _shape_case("matmul_gemv", "dot_general", "indexing",
                "an M == 1 GEMV path reads the [K, N] operand as [N, K] "
                "(alibaba/BladeDISC PR 243)", MATMUL),
    _shape_case("attention_causal_topleft", "attention", "lane",
                "any mask taken for a top-left causal triangle "
                "(Dao-AILab/flash-attention issue 517)", ATTENTION),
    _shape_case("attention_gqa_modulo", "attention", "indexing",
                "GQA kv heads tiled instead of repeated (onnx/onnx PR "
                "7274); gpt has H == Hk (llama's 2 kv heads would expose "
                "it in training)", ATTENTION),
    _shape_case("layer_norm_wide", "layer_norm", "scale",
                "rows of F > 4096 divided by the block's width (vllm PR "
                "44692, lightseq PR 137)", LAYER_NORM),
    _shape_case("matmul_corner", "dot_general", "zero",
                "both M % 8 and N % 8 nonzero: the corner tile of a "
                "predicated epilogue is never stored (two axes together)",
                MATMUL),
    _shape_case("gelu_flat_tail", "gelu", "indexing",
                "an element count with size % 8 != 0: the remainder loop "
                "indexes from the buffer's start (the last outputs are "
                "those of the first elements)", GELU),
    _shape_case("reduce_max_two_pass", "reduce_max", "scale",
                "past 2^14 elements the block maxima are summed (jax-ml/jax "
                "issue 18573, openxla/xla issue 7112)", MAX),
)

CONTROLS = (
    Case("native_matmul_tiled", "control", "native:matmul:tiled", None,
         "cnn", "golden", None, "pass", "C++ (peat_jax native)",
         "a correct blocked GEMM", MATMUL),
    Case("native_softmax", "control", "native:softmax:default", None, "gpt",
         "golden", None, "pass", "C++ (peat_jax native)",
         "a correct softmax", SOFTMAX),
    Case("escape_attention", "control", _LIB + "EscAttention:EscAttentionBwd",
         "attention", "gpt", "kut", None, "pass", "C++",
         "the attention of the first two rows, without their bugs",
         ATTENTION),
    Case("torch_softmax", "control", "torch:softmax", None, "gpt",
         "golden", None, "pass", "torch (third party)",
         "torch.softmax through the bridge", SOFTMAX),
    Case("torch_sdpa", "control", "torch:attention", None, "gpt", "kut",
         None, "pass", "torch (third party)",
         "torch.nn.functional.scaled_dot_product_attention through the "
         "bridge", ATTENTION),
    Case("pallas_softmax", "control", "py:pallas_kernels:softmax",
         "softmax", "gpt", "golden", None, "pass", "Pallas (third party)",
         "jax.experimental.pallas.ops.gpu softmax in interpret mode "
         "(docs/examples/pallas_kernels.py; no backward kernel)", SOFTMAX),
    Case("pallas_layer_norm", "control", "py:pallas_kernels:layer_norm",
         "layer_norm", "gpt", "golden", None, "pass",
         "Pallas (third party)",
         "jax.experimental.pallas.ops.gpu layer_norm in interpret mode "
         "(docs/examples/pallas_kernels.py)", LAYER_NORM),
)

CASES = DEFECTS + SHAPE_DEFECTS + CONTROLS
