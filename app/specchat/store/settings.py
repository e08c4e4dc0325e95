"""App settings (sampling, system prompt, speculative options, last pair),
kept as one JSON value in the store's ``settings`` table so they survive
upgrades: unknown keys are dropped and missing ones take their defaults."""

from __future__ import annotations

import json
import sqlite3
import typing
from dataclasses import asdict, dataclass, fields

from specchat import records, values


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
    # A decoding mode chosen by name (engine/modes.py), or None: chosen for
    # the pair (hybrid with a draft model, suffix matching without one).
    spec_mode: str | None = None
    # Break-even auto-off: decode plainly while speculating is measured slower
    # than plain decoding here (engine/auto_off.py, BreakEven).
    auto_off: bool = True
    color_tokens: bool = False
    last_target: str | None = None
    last_draft: str | None = None
    # The local OpenAI-compatible API inside the app (127.0.0.1 only).
    local_server: bool = False
    server_port: int = 8321  # specchat serve's default too (server/listener.py)
    # Web origins whose pages may call it from a browser (CORS); none: no page may.
    server_cors_origins: tuple[str, ...] = ()
    # The memory, in GB, the engine's caches of conversations put aside may
    # hold (engine/prompt_cache.py; specchat serve --prompt-cache-gb): the
    # chat and the API's clients alike; 0 keeps one conversation at a time.
    prompt_cache_gb: float = values.PROMPT_CACHE_GB


# The presets change sampling only; the system prompt and speculation stay.
PRESETS: dict[str, dict] = {
    "Greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
    "Balanced": {"temperature": 0.7, "top_p": 0.9, "top_k": 40},
    "Creative": {"temperature": 1.0, "top_p": 0.95, "top_k": 0},
}


def preset_of(settings: AppSettings) -> str | None:
    for name, preset in PRESETS.items():
        if all(getattr(settings, k) == v for k, v in preset.items()):
            return name
    return None


# The stored fields checked against a range (a name in specchat.values' table,
# or "allowed origins": a list of values.origin, _origins); every other field
# only against its declared type.
_RANGES = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k",
           "max_tokens": "max tokens", "seed": "seed", "k": "K", "server_port": "port",
           "server_cors_origins": "allowed origins", "prompt_cache_gb": "prompt cache"}
_TYPES = typing.get_type_hints(AppSettings)


def _origins(value: object) -> tuple[str, ...]:
    """Web origins, each as ``values.origin`` keeps it (stored as a JSON list)."""
    if not isinstance(value, list | tuple):
        raise values.BadValue(f"allowed origins must be a list of origins; got "
                              f"{type(value).__name__}")
    return tuple(dict.fromkeys(values.origin(v) for v in value))


def _checked(name: str, value: object) -> object:
    """The value to keep for a field, or BadValue."""
    rule = _RANGES.get(name)
    if rule == "allowed origins":
        return _origins(value)
    if rule is not None:
        return values.check(rule, value)
    if not records.conforms(value, _TYPES[name]):
        raise values.BadValue(f"{name} has the wrong type ({type(value).__name__})")
    return value


def checked_changes(changes: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """The changes whose values are in range (as their field's kind), and
    the one-line reason for each that is not: what a session applies."""
    good: dict[str, object] = {}
    refused: list[str] = []
    for name, value in changes.items():
        try:
            good[name] = _checked(name, value) if name in _TYPES else value
        except values.BadValue as exc:
            refused.append(str(exc))
    return good, refused


def from_stored(data: object) -> tuple[AppSettings, list[str]]:
    """Settings from a stored JSON value, and the names (as people read them:
    "top-p", "system prompt") of the fields that were not valid and took their defaults. Why field by field: one bad value
    (a hand edit, an older or newer version's file) must not cost the user
    every other setting, nor stop the app from starting."""
    if not isinstance(data, dict):
        return AppSettings(), ["all settings"]
    good: dict[str, object] = {}
    bad: list[str] = []
    for f in fields(AppSettings):
        if f.name not in data:
            continue
        try:
            good[f.name] = _checked(f.name, data[f.name])
        except Exception:  # noqa: BLE001 - whatever a stored value breaks, it is one field
            bad.append(_RANGES.get(f.name, f.name.replace("_", " ")))
    return AppSettings(**good), bad


class SettingsStore:
    KEY = "app"

    def __init__(self, conn: sqlite3.Connection):
        self._db = conn

    def load(self) -> AppSettings:
        return self.read()[0]

    def read(self) -> tuple[AppSettings, list[str]]:
        """The stored settings and the fields that fell back to defaults."""
        row = self._db.execute("SELECT value FROM settings WHERE key=?", (self.KEY,)).fetchone()
        if row is None:
            return AppSettings(), []
        try:
            data = records.parse_json(row["value"])
        except records.BadRecord:
            return AppSettings(), ["all settings"]
        return from_stored(data)

    def save(self, settings: AppSettings) -> None:
        self._db.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (self.KEY, json.dumps(asdict(settings))))
