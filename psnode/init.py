"""``psnode.init``: MXNet's initializers (``psnode.init.Xavier(...)``); see psnode.initializer."""
from psnode.initializer import Constant, Initializer, Normal, One, Uniform, Xavier, Zero, create, from_spec

__all__ = ["Constant", "Initializer", "Normal", "One", "Uniform", "Xavier", "Zero", "create", "from_spec"]
