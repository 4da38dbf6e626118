"""Recovery under kill -9: soak.py, the restart storm again and again."""
