#!/usr/bin/env python3
"""List the tools of every stdio server in an MCP client configuration, as
the client would start them, with the official Python MCP SDK client.

    mcp_list_tools.py CONFIG KEY

KEY is the object of servers in CONFIG (`mcpServers`, `servers`, ...).
CONFIG may have comments (`//`, `/* */`) and trailing commas, as VS Code's
and Zed's do. Prints one JSON object: server name -> sorted tool names.
Exits 2 if the `mcp` package is missing.
"""
import asyncio
import json
import os
import re
import sys

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
except ImportError as e:  # pragma: no cover
    print(f"SKIP: the Python `mcp` package is not installed ({e}); pip install mcp", file=sys.stderr)
    sys.exit(2)


def strip_jsonc(text):
    """Comments and trailing commas out, strings left alone."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


async def tools_of(server):
    env = dict(os.environ)
    env.update(server.get("env") or {})
    params = StdioServerParameters(command=server["command"], args=server.get("args", []), env=env)
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            listed = await s.list_tools()
            return sorted(t.name for t in listed.tools)


async def main():
    config, key = sys.argv[1], sys.argv[2]
    with open(config) as f:
        servers = json.loads(strip_jsonc(f.read()))[key]
    out = {}
    for name, server in servers.items():
        if "command" in server:
            out[name] = await tools_of(server)
    print(json.dumps(out))


asyncio.run(main())
