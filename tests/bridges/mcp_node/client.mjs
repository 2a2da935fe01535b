// The official TypeScript MCP SDK's client against `lobby mcp` (tests/bridges/test_mcp.py):
//
//   node client.mjs http URL               streamable HTTP at URL
//   node client.mjs stdio COMMAND ARG...   stdio, starting `lobby mcp` itself
//
// It lists the tools and calls echo.echo (well and badly) and late--comer.greet-2ev1 (offline),
// prints what it saw as one JSON line, then waits for notifications/tools/list_changed (the
// test brings late-comer online), lists and calls again and prints a second line. A call that
// throws is reported as {"thrown": {"code", "message"}}: the test asserts none does.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const WAIT_MS = 20_000;

const [kind, ...rest] = process.argv.slice(2);
const transport =
  kind === "http"
    ? new StreamableHTTPClientTransport(new URL(rest[0]))
    : new StdioClientTransport({ command: rest[0], args: rest.slice(1), env: process.env });

const client = new Client({ name: "agent-lobby-test", version: "0.1.0" });
let listChanged = () => {};
client.setNotificationHandler(ToolListChangedNotificationSchema, () => listChanged());

async function toolNames() {
  return (await client.listTools()).tools.map((tool) => tool.name).sort();
}

async function call(name, args) {
  try {
    return { result: await client.callTool({ name, arguments: args }) };
  } catch (error) {
    return { thrown: { code: error.code, message: error.message } };
  }
}

function within(promise, what) {
  const timeout = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`no ${what} in ${WAIT_MS} ms`)), WAIT_MS).unref(),
  );
  return Promise.race([promise, timeout]);
}

await client.connect(transport);
const first = {
  tools: await toolNames(),
  echo: await call("echo.echo", { text: "hi" }),
  bad: await call("echo.echo", { text: 5 }),
  offline: await call("late--comer.greet-2ev1", {}),
};
const changed = new Promise((resolve) => {
  listChanged = resolve; // only from here: the test changes the tools once it has read `first`
});
console.log(JSON.stringify(first));

await within(changed, "notifications/tools/list_changed");
const second = {
  tools: await toolNames(),
  online: await call("late--comer.greet-2ev1", {}),
};
console.log(JSON.stringify(second));
await client.close();
