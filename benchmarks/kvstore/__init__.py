"""psnode's push/pull rounds against MXNet's KVStore, raw pyzmq, torch gloo and a bare PS (run.py),
over W x S (scaling.py), profiled (profile_case.py)."""
