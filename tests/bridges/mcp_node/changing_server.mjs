// An MCP server on the official TypeScript SDK whose tools change while it runs: `unlock`
// replaces itself with `secret`, and the SDK says so with notifications/tools/list_changed.
// The TypeScript twin of tests/bridges/changing_server.py (which is on stdio), for
// `lobby bridge mcp --url` following the tool list of a server not written in Python: streamable
// HTTP on a free port of 127.0.0.1, for one client; its URL is the first line on stdout.
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";

const server = new McpServer({ name: "vault", version: "0.1.0" });

function answer(result) {
  return { content: [{ type: "text", text: result }], structuredContent: { result } };
}

const unlock = server.registerTool(
  "unlock",
  { description: "Offers `secret` in place of itself." },
  async () => {
    server.registerTool("secret", { description: "Tells the secret." }, async () =>
      answer("forty-two"),
    );
    unlock.remove();
    return answer("unlocked");
  },
);

const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: randomUUID });
await server.connect(transport);
const http = createServer((request, response) => transport.handleRequest(request, response));
http.listen(0, "127.0.0.1", () => {
  console.log(`http://127.0.0.1:${http.address().port}/mcp`);
});
