"""The engine client as the app uses it: references resolved by the library
(bundled:, hf:, .gguf, installed names, folders) and a memory check before
every load."""

from __future__ import annotations

from specchat.engine.client import EngineClient
from specchat.library import memory, refs


def make_client() -> EngineClient:
    return EngineClient(resolver=refs.resolve, preflight=memory.preflight)
