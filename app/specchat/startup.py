"""What a SpecChat process does once, first, before anything imports MLX.

Importing a SpecChat package has no side effects; the entry points (the
``specchat`` command, the test suite's conftest, the scripts in benchmarks/)
call ``prepare()`` themselves, so nothing depends on which module happened
to be imported first.
"""

import os
import tempfile

from specchat import values
from specchat.engine import blas
from specchat.home import home


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


def temporary_files_at_home() -> None:
    """Make ``<home>/tmp`` this process's temporary folder (TMPDIR), so the
    ``specchat`` command writes nothing outside its home: on Linux, MLX's CPU
    backend compiles fused kernels with the system's C++ compiler into
    ``$TMPDIR/mlx/<version>/cpu/`` and keeps them there, and the compiler
    and Python's ``tempfile`` write their own files there too. The entry
    point calls this (cli.main), not library code or the tests, which pick
    their own home per test."""
    folder = home() / "tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # a home that cannot be written says so where it is used
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # computed again from TMPDIR on next use
