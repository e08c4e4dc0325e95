"""The MLX engine: loading, drafters, acceptance, the speculative loop, stats.

No Qt here, and it runs headless. Importing this package loads the system
BLAS first (see blas.py), so import it before anything imports MLX.
"""

import os as _os

from specchat.engine import blas as _blas

# mlx-lm's tokenizers come through transformers, which warns at import that
# PyTorch is missing; SpecChat never needs PyTorch.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
_blas.preload()
