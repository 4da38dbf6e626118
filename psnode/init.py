"""``psnode.init``: MXNet's initializers (``psnode.init.Xavier(...)``), and ``ps_initializer(init)``
to have the servers compute a key's values; see psnode.math.initializers."""
from psnode.math.initializers import (
    Constant,
    Initializer,
    Normal,
    One,
    OnServers,
    Uniform,
    Xavier,
    Zero,
    create,
    from_spec,
    ps_initializer,
)

__all__ = ["Constant", "Initializer", "Normal", "OnServers", "One", "Uniform", "Xavier", "Zero", "create", "from_spec",
           "ps_initializer"]
