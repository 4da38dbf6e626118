"""``psnode.kv``: the KVStore entry point (``psnode.kv.create('dist_sync')``)."""
from psnode.kvstore import AGGREGATORS, TYPES, KVStore, create

__all__ = ["AGGREGATORS", "TYPES", "KVStore", "create"]
