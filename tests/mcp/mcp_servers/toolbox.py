"""An MCP server for the tests, written with the SDK's own server class (``MCPServer``), run
as a subprocess over stdio: ``python tests/mcp/mcp_servers/toolbox.py [--only TOOL,...]
[--bad-schema] [--fail-start] [--hang-start]``.

Tools: ``add``, ``colour_of`` (an enum argument, so that even a tiny model's forced call is
valid), ``slow`` (sleeps), ``crash`` (the process exits mid-call), ``flood`` (megabytes of
text), ``picture`` (a PNG), ``consult`` (asks the host's model through MCP sampling); the
prompt ``review``; the resource ``notes://today``. ``--only`` lists only the tools named.
``--bad-schema`` adds a tool whose input
schema is not valid JSON Schema. ``--fail-start`` exits at once with a message on stderr;
``--hang-start`` never answers. Every call is appended to the file named by
``TOOLBOX_CALLS`` (one JSON line: tool, arguments), so a test can tell what ran.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from typing import Annotated, Any, Literal

if "--fail-start" in sys.argv:
    print("toolbox: cannot open the database /nowhere/db.sqlite", file=sys.stderr, flush=True)
    sys.exit(2)
if "--hang-start" in sys.argv:
    time.sleep(3600)

from mcp.server.mcpserver import Image, MCPServer, Resolve, Sample
from mcp.types import CreateMessageResult, SamplingMessage, TextContent, Tool

# A 1x1 red PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


class Toolbox(MCPServer):
    """The SDK's server, with a tool of broken schema when asked for one."""

    async def list_tools(self) -> list[Tool]:
        """The tools, plus ``broken`` with ``--bad-schema``."""
        tools = await super().list_tools()
        if "--only" in sys.argv:
            kept = sys.argv[sys.argv.index("--only") + 1].split(",")
            tools = [tool for tool in tools if tool.name in kept]
        if "--bad-schema" in sys.argv:
            schema = {"type": "object", "properties": {"x": {"type": "nonsense"}}}
            tools.append(Tool(name="broken", description="Never offered", input_schema=schema))
        return tools


server = Toolbox("toolbox")


def _record(tool: str, arguments: dict[str, Any]) -> None:
    path = os.environ.get("TOOLBOX_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    _record("add", {"a": a, "b": b})
    return a + b


@server.tool()
def colour_of(thing: Literal["sky", "grass"]) -> str:
    """The colour of the sky or of grass."""
    _record("colour_of", {"thing": thing})
    return {"sky": "blue", "grass": "green"}[thing]


@server.tool()
async def slow(seconds: float) -> str:
    """Wait that many seconds, then answer."""
    _record("slow", {"seconds": seconds})
    await asyncio.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def crash() -> str:
    """Exit in the middle of the call."""
    _record("crash", {})
    print("toolbox: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def flood(megabytes: int) -> str:
    """Answer with that many megabytes of text."""
    _record("flood", {"megabytes": megabytes})
    return "x" * (megabytes << 20)


@server.tool()
def picture() -> Image:
    """A small picture."""
    _record("picture", {})
    return Image(data=PNG, format="png")


def _question(question: str) -> Sample:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=question))
    return Sample([message], max_tokens=16, system_prompt="Answer in one word.")


@server.tool()
async def consult(question: str, answer: Annotated[CreateMessageResult, Resolve(_question)]) -> str:
    """Ask the host's model a question (MCP sampling) and report its answer."""
    _record("consult", {"question": question})
    content = answer.content
    return f"the model answered: {getattr(content, 'text', content)}"


@server.prompt()
def review(topic: str) -> str:
    """Ask for a review of a topic."""
    return f"Please review {topic} in one sentence."


@server.resource("notes://today", mime_type="text/plain")
def notes() -> str:
    """Today's notes."""
    return "Buy milk. Call Ada at noon."


if __name__ == "__main__":
    server.run()
