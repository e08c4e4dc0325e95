"""SpecChat's one folder for everything it keeps: models, history, settings.

``platformdirs.user_data_dir("SpecChat")`` unless ``SPECCHAT_HOME`` points
elsewhere (tests, power users), read from the environment on every call so a
test can point it at a temporary directory at any time. It sits at the top
of the package because the library (models) and the store (history) both
live under it and neither may import the other.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "SpecChat"


def home() -> Path:
    """The root folder (not created here)."""
    override = os.environ.get("SPECCHAT_HOME", "").strip()
    if override:
        return Path(override).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
