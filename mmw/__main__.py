"""``python -m mmw`` = the ``mmw`` command."""

from mmw.cli import app

app(prog_name="mmw")
