"""The local OpenAI-compatible API, and Anthropic's Messages API beside it
(``specchat serve``, and Settings' "Local server" switch in the app).

Layer: it may import the engine (through ``EngineClient``: it never touches
MLX itself), the library, ``specchat.values`` and ``specchat.errors``;
never the store or the window. ``protocol`` maps OpenAI's bodies to engine
requests and back, ``responses`` the Responses API's and ``anthropic``
Anthropic's onto the same requests, all through ``fields``' checks, each
streaming its reply's parts through ``reply_stream``; ``service`` queues
requests onto the engine thread, ``app`` is the HTTP side (Starlette), its routes built from ``endpoints``'
table (which Settings lists too), ``guard`` keeps web pages out (Host
and Origin), ``body`` reads a request's JSON within its bounds,
``listener`` binds and runs it (uvicorn, with ``connections``' deadline for
headers). docs/api.md says how to use it, and its Security section what is
checked.
"""

# Where the API listens unless told otherwise, and the variable that holds
# its key. Here rather than in listener.py, so the command line's help names
# them without importing uvicorn and Starlette.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321
KEY_VARIABLE = "SPECCHAT_API_KEY"
