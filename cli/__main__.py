"""``python -m cli``: the same as the ``mxdist`` command."""
from cli.main import app

app(prog_name="mxdist")
