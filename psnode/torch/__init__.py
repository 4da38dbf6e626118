"""``psnode.torch``: train a ``torch.nn.Module`` through a psnode KVStore (needs PyTorch).

- :mod:`~psnode.torch.trainer`: :class:`DistributedTrainer` and :func:`wrap`.
- :mod:`~psnode.torch.devices`: torch tensors (one per local device) to and from host arrays.
- :mod:`~psnode.torch.embedding`: :class:`Embedding` and :class:`EmbeddingBag`, tables on the servers.

The only package of psnode that imports torch; without it, importing this one raises ImportError
saying ``pip install torch``.
"""
try:
    import torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError("psnode.torch needs PyTorch, which is not installed: pip install torch "
                      "(a CPU build is enough)") from _exc

from psnode.torch.devices import host_value, scatter
from psnode.torch.embedding import Embedding, EmbeddingBag
from psnode.torch.trainer import DistributedTrainer, host_dtype, numpy_view, wrap

__all__ = ["DistributedTrainer", "Embedding", "EmbeddingBag", "host_dtype", "host_value", "numpy_view", "scatter",
           "wrap"]
