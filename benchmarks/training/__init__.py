"""Models trained end to end: train.py and embedding.py (against DDP + gloo), gluon.py (against
MXNet), stragglers.py (sync modes against stragglers)."""
