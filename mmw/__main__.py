"""``python -m mmw`` = the ``mmw`` command."""

from mmw.cli import main

main()
