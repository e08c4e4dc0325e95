"""What a SpecChat process does once, first, before anything imports MLX.

Importing a SpecChat package has no side effects; the entry points (the
``specchat`` command, the test suite's conftest, the scripts in benchmarks/)
call ``prepare()`` themselves, so nothing depends on which module happened
to be imported first.
"""

import os

from specchat import values
from specchat.engine import blas


def prepare() -> None:
    """Check the environment variables SpecChat reads (``values.CHOICES``:
    a bad one is a ``BadValue``, one line naming the variable and what it
    takes, before anything is loaded), load the system BLAS (it only takes
    effect before MLX is imported; engine/blas.py) and quiet transformers'
    import-time warning that PyTorch is missing (SpecChat never needs
    PyTorch)."""
    for name in values.CHOICES:
        values.environment(name)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    blas.preload()
