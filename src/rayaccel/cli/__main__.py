"""``python -m rayaccel.cli``: the same as the ``rayaccel`` command."""

from . import main

main()
