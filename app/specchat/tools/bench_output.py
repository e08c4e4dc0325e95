"""Where ``specchat bench --json FILE`` writes its report.

Over nothing of the person's (specchat/outputs.py): a new file, or a report
a bench wrote before (the same command run again). Checked before the bench
imports MLX and loads anything, and again when the report is written, so
a file given by mistake (the prompts themselves) is refused at once instead
of being replaced after minutes of benchmarking. Imports no MLX.
"""

from __future__ import annotations

from pathlib import Path

from specchat import outputs, records

# What every report bench.py writes holds, and its size at most (a few
# hundred kilobytes: a file far past that is not a report).
REPORT_KEYS = ("machine", "models", "settings", "modes")
MAX_REPORT_BYTES = 64 * 2**20
HINT = "choose another --json file, or remove that one first"


def is_report(path: Path) -> bool:
    """Whether ``path`` is a report ``specchat bench --json`` wrote."""
    try:
        data = records.read_json(path, MAX_REPORT_BYTES)
    except (OSError, records.BadRecord):
        return False
    return isinstance(data, dict) and all(k in data for k in REPORT_KEYS)


def check(path: str) -> Path:
    """The report's file, if the bench may write it; else ``outputs.Refused``."""
    return outputs.file(path, "the report", is_report, HINT)


def write(path: str, report: dict) -> Path:
    """The report written there whole, checked again first."""
    return outputs.write_json(path, report, "the report", is_report, HINT, indent=2)
