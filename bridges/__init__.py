"""PyTorch bridge (installed as ``peat_jax.bridges``); imports torch lazily.

Importing this package registers the built-in torch KUT specs
(``torch:matmul``, ``torch:conv2d``, ``torch:softmax``, ...; see
:data:`peat_jax.bridges.torch_kut.BUILTIN`) without importing torch; torch is
imported when a torch kernel first runs, and a missing install raises
:class:`TorchNotInstalledError` saying how to install it.

| module | what |
| --- | --- |
| :mod:`~peat_jax.bridges.torch_kut` | torch functions as JAX ops and as KUTs at sites (zero copy) |
| :mod:`~peat_jax.bridges.torch_models` | torch ports of the reference models, explicit weight maps |
| :mod:`~peat_jax.bridges.compare` | layer-by-layer and train-step comparison of a port against JAX |
"""

from peat_jax.bridges._torch import TorchNotInstalledError as TorchNotInstalledError
from peat_jax.bridges._torch import from_torch as from_torch
from peat_jax.bridges._torch import require_torch as require_torch
from peat_jax.bridges._torch import to_torch as to_torch
from peat_jax.bridges.torch_kut import register_torch_kut as register_torch_kut
from peat_jax.bridges.torch_kut import registered as registered
from peat_jax.bridges.torch_kut import torch_op as torch_op
from peat_jax.bridges import torch_kut as _torch_kut

_torch_kut.register_builtin()
