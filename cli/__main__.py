"""``python -m mxdist``: the same as the ``mxdist`` command."""
from .main import app

app(prog_name="mxdist")
