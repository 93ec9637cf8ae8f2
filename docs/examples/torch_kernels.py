"""A torch function as a kernel under test (``torch:`` KUT spec).

``torch:torch_kernels:gelu --kernel=gelu`` runs PyTorch's GELU at the
model's ``jax.nn.gelu`` sites through the PyTorch bridge (zero-copy
DLPack, torch autograd for the backward). PyTorch's default is the exact
erf form; ``jax.nn.gelu``'s default is the tanh approximation: the classic
slip of a port between the two frameworks.
"""

import torch


def gelu(x):
  return torch.nn.functional.gelu(x)
