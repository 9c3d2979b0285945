// A minimal Jira MCP server (stdio, newline-delimited JSON-RPC, Node's
// standard library only) with one tool, `search`: a JQL query sent to
// GET https://$JIRA_HOST/rest/api/2/search with `Authorization: Bearer
// $JIRA_TOKEN`. Under cordon, JIRA_TOKEN is a placeholder and the host is
// reached through the egress doors (DNS and a transparent door; TLS trusted
// through NODE_EXTRA_CA_CERTS, the session CA cordon sets), which put the
// real token in its place. The result names what the server itself held,
// so an agent can see it never had the token.
"use strict";
const https = require("https");
const readline = require("readline");

function send(msg) {
  process.stdout.write(JSON.stringify(msg) + "\n");
}

function search(jql) {
  const host = process.env.JIRA_HOST || "jira.example";
  const token = process.env.JIRA_TOKEN || "";
  const path = "/rest/api/2/search?maxResults=5&jql=" + encodeURIComponent(jql);
  return new Promise((resolve) => {
    const req = https.request(
      { host, port: 443, path, method: "GET", headers: { Authorization: "Bearer " + token, Accept: "application/json" } },
      (res) => {
        let body = "";
        res.on("data", (c) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode, body }));
      }
    );
    req.setTimeout(20000, () => req.destroy(new Error("timed out")));
    req.on("error", (e) => resolve({ status: 0, body: String(e) }));
    req.end();
  });
}

function render(r) {
  const held = (process.env.JIRA_TOKEN || "(unset)").slice(0, 18) + "...";
  if (r.status !== 200) {
    return { text: `HTTP ${r.status}: ${r.body}\n(JIRA_TOKEN in this server: ${held})`, isError: true };
  }
  let lines;
  try {
    const j = JSON.parse(r.body);
    lines = (j.issues || []).map((i) => `${i.key}  ${(i.fields && i.fields.summary) || ""}`);
    lines.unshift(`${j.total} issue(s):`);
  } catch (e) {
    return { text: `unreadable answer: ${e}`, isError: true };
  }
  lines.push(`(JIRA_TOKEN in this server: ${held})`);
  return { text: lines.join("\n"), isError: false };
}

const TOOLS = [{
  name: "search",
  description: "Search Jira issues with a JQL query.",
  inputSchema: { type: "object", properties: { jql: { type: "string" } }, required: ["jql"] },
}];

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  let m;
  try {
    m = JSON.parse(line);
  } catch {
    return;
  }
  if (m.id === undefined) {
    return;
  }
  if (m.method === "initialize") {
    send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "jira-mcp", version: "1" } } });
  } else if (m.method === "tools/list") {
    send({ jsonrpc: "2.0", id: m.id, result: { tools: TOOLS } });
  } else if (m.method === "tools/call" && m.params.name === "search") {
    const out = render(await search(String((m.params.arguments || {}).jql || "")));
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: out.text }], isError: out.isError } });
  } else {
    send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "method not found" } });
  }
});
