"""Fixtures for the API tests: the tiny pair loaded once on an engine thread,
and a live server on a free loopback port that the real ``openai`` client
talks to over HTTP; the scripted agent pair (tinymodels.AGENT_CHAINS)
served the same way."""

from __future__ import annotations

import pytest


class Recorder:
    """Every Activity the service reports (from the server's thread)."""

    def __init__(self):
        self.seen = []

    def __call__(self, activity) -> None:
        self.seen.append(activity)

    def ended(self) -> list:
        return [a for a in self.seen if a.finished is not None]


@pytest.fixture(scope="module")
def tiny_client(tiny_target, tiny_draft):
    from specchat.engine.client import EngineClient

    client = EngineClient()
    pair = client.load(str(tiny_target), str(tiny_draft)).wait(120)
    yield client, pair
    client.close()


@pytest.fixture(scope="module")
def live(tiny_client, tiny_target):
    """(server, recorder): the tiny pair served on 127.0.0.1, any free port."""
    from specchat.engine import modes
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    client, pair = tiny_client
    recorder = Recorder()
    mode = modes.for_pair(True, pair.draft is not None, pair.speculative_ok)
    service = ApiService(client, Served.of(pair, mode.name, None, str(tiny_target)),
                         on_activity=recorder)
    server = LocalServer(service, port=0)
    server.start()
    yield server, recorder
    server.stop()


@pytest.fixture(scope="module")
def agent_server(agent_target, agent_draft):
    """The scripted agent pair (tinymodels.AGENT_CHAINS: reasoning, then
    tool calls) served on 127.0.0.1, drafting 4 tokens at a time."""
    from specchat.engine import modes
    from specchat.engine.client import EngineClient
    from specchat.server.listener import LocalServer
    from specchat.server.service import ApiService, Served

    client = EngineClient()
    pair = client.load(str(agent_target), str(agent_draft)).wait(120)
    service = ApiService(client, Served.of(pair, modes.HYBRID.name, 4))
    server = LocalServer(service, port=0)
    server.start()
    yield server
    server.stop()
    client.close()


@pytest.fixture
def agent_model(agent_target) -> str:
    """The agent pair's model id, as GET /v1/models lists it."""
    return agent_target.name


@pytest.fixture
def agent_api(agent_server):
    """The real ``openai`` client of the agent pair's server."""
    from openai import OpenAI

    with OpenAI(base_url=agent_server.url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
def api(live):
    from openai import OpenAI

    server, _ = live
    with OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


