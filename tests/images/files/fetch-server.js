// A minimal MCP server (stdio, newline-delimited JSON-RPC, Node's standard
// library only) with one tool, `get`, that fetches an http:// URL through
// the proxy its environment names (cordon's egress door): the shape of the
// seed's `jira_search`, an MCP server from an image with one egress host.
"use strict";
const http = require("http");
const readline = require("readline");

function send(msg) {
  process.stdout.write(JSON.stringify(msg) + "\n");
}

function get(url) {
  return new Promise((resolve) => {
    const proxy = new URL(process.env.http_proxy || process.env.HTTP_PROXY || "http://127.0.0.1:3128");
    const req = http.request(
      { host: proxy.hostname, port: proxy.port, method: "GET", path: url, headers: { Host: new URL(url).host } },
      (res) => {
        let body = "";
        res.on("data", (c) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode, body }));
      }
    );
    req.on("error", (e) => resolve({ status: 0, body: String(e) }));
    req.end();
  });
}

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  let m;
  try {
    m = JSON.parse(line);
  } catch {
    return;
  }
  if (m.method === "initialize") {
    send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "fetch-image", version: "1" } } });
  } else if (m.method === "tools/list") {
    send({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "get", description: "Fetch a URL.",
      inputSchema: { type: "object", properties: { url: { type: "string" } }, required: ["url"] } }] } });
  } else if (m.method === "tools/call") {
    const r = await get(m.params.arguments.url);
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: `HTTP ${r.status}: ${r.body}` }],
      isError: r.status !== 200 } });
  } else if (m.id !== undefined) {
    send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "method not found" } });
  }
});
