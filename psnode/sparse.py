"""``psnode.sparse``: row_sparse values (``row_sparse_array``, ``zeros``, :class:`RowSparseArray`).

The implementation lives in :mod:`psnode.math.sparse`.
"""
from psnode.math.sparse import RowSparseArray, row_sparse_array, table, zeros

__all__ = ["RowSparseArray", "row_sparse_array", "table", "zeros"]
