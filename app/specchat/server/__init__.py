"""The local OpenAI-compatible API (``specchat serve``, and Settings'
"Local server" switch in the app).

Layer: it may import the engine (through ``EngineClient``: it never touches
MLX itself), the library, ``specchat.values`` and ``specchat.errors``;
never the store or the window. ``protocol`` maps OpenAI's bodies to engine
requests and back, ``service`` queues requests onto the engine thread,
``app`` is the HTTP side (Starlette), ``listener`` binds and runs it
(uvicorn). docs/api.md says how to use it.
"""
