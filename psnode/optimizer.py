"""``psnode.optimizer``: the server-side optimizers (``psnode.optimizer.create('sgd', ...)``).

The update rules live in :mod:`psnode.math.optimizers`.
"""
from psnode.math.optimizers import SGD, AdaGrad, Adam, Optimizer, create, from_spec, register, registered

__all__ = ["SGD", "AdaGrad", "Adam", "Optimizer", "create", "from_spec", "register", "registered"]
