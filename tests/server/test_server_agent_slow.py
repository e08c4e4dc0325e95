"""An agent framework from PyPI (the OpenAI Agents SDK, through the real
``openai`` client) completes a two-tool task with the bundled pair through
``specchat serve`` with speculation on: the tools are offered with the
model's own template, its calls come back as ``tool_calls`` the SDK runs,
their results go back as ``tool`` messages, and the second call uses what
the first returned. (The bundled 1.5B coder makes the calls but ends its
run without a sentence of its own: greedy, after the conversion it calls
again, then replies with its end token alone; so the test asserts the
calls and their drafting, not prose.)"""

from __future__ import annotations

import asyncio
import re

import pytest
from server_support import Serving

pytest.importorskip("agents")

TASK = "What is the weather in Paris, in Fahrenheit?"


async def _run(base_url: str, model: str) -> tuple[str, list[tuple]]:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    calls: list[tuple] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city, in degrees Celsius.

        Args:
            city: the city's name
        """
        calls.append(("get_weather", city))
        return "18 degrees Celsius, cloudy"

    @function_tool
    def to_fahrenheit(celsius: str) -> str:
        """Convert degrees Celsius to Fahrenheit.

        Args:
            celsius: the temperature in Celsius
        """
        calls.append(("to_fahrenheit", celsius))
        return f"{float(celsius) * 9 / 5 + 32:.1f} degrees Fahrenheit"

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="unused", timeout=1800)
    agent = Agent(name="assistant", instructions="You are a helpful assistant.",
                  tools=[get_weather, to_fahrenheit],
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(temperature=0.0, max_tokens=200))
    result = await Runner.run(agent, TASK, max_turns=6, run_config=RunConfig(tracing_disabled=True))
    await client.close()
    return str(result.final_output), calls


@pytest.mark.slow
def test_an_agent_framework_completes_a_two_tool_task(real_home):
    from openai import OpenAI

    serving = Serving(["--port", "0"], real_home)
    try:
        model = OpenAI(base_url=serving.url, api_key="unused").models.list().data[0].id
        _, calls = asyncio.run(_run(serving.url, model))
    finally:
        log = serving.stop()
    # The second call's argument is the first call's result.
    assert calls[:2] == [("get_weather", "Paris"), ("to_fahrenheit", "18")], (calls, log)
    assert "draft model qwen2.5-coder-0.5b" in log
    accepted = [int(a) for a in re.findall(r"\(tool_calls\).*acceptance (\d+)%", log)]
    assert len(accepted) >= 2 and max(accepted) > 0, log  # the calls were drafted, in part
