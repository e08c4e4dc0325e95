"""App settings (sampling, system prompt, speculative options, last pair),
kept as one JSON value in the store's ``settings`` table so they survive
upgrades: unknown keys are dropped and missing ones take their defaults."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class AppSettings:
    system_prompt: str = "You are a helpful assistant."
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512
    seed: int | None = None
    speculative: bool = True
    k: int | None = None  # None = adaptive
    color_tokens: bool = False
    last_target: str | None = None
    last_draft: str | None = None


# The presets change sampling only; the system prompt and speculation stay.
PRESETS: dict[str, dict] = {
    "Greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 40},
    "Creative": {"temperature": 1.0, "top_p": 0.95, "top_k": 0},
}


def apply_preset(settings: AppSettings, name: str) -> AppSettings:
    return replace(settings, **PRESETS[name])


def preset_of(settings: AppSettings) -> str | None:
    for name, values in PRESETS.items():
        if all(getattr(settings, k) == v for k, v in values.items()):
            return name
    return None


class SettingsStore:
    KEY = "app"

    def __init__(self, conn: sqlite3.Connection):
        self._db = conn

    def load(self) -> AppSettings:
        row = self._db.execute("SELECT value FROM settings WHERE key=?", (self.KEY,)).fetchone()
        if row is None:
            return AppSettings()
        try:
            data = json.loads(row["value"])
        except ValueError:
            return AppSettings()
        known = {f.name for f in fields(AppSettings)}
        try:
            return AppSettings(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return AppSettings()

    def save(self, settings: AppSettings) -> None:
        self._db.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (self.KEY, json.dumps(asdict(settings))))
