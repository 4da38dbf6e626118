"""``psnode.init``: MXNet's initializers (``psnode.init.Xavier(...)``); see psnode.math.initializers."""
from psnode.math.initializers import Constant, Initializer, Normal, One, Uniform, Xavier, Zero, create, from_spec

__all__ = ["Constant", "Initializer", "Normal", "One", "Uniform", "Xavier", "Zero", "create", "from_spec"]
