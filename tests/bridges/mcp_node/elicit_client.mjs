// The official TypeScript MCP SDK's client answering elicitation, against `lobby mcp` over
// streamable HTTP (tests/bridges/test_mcp_input.py):
//
//   node elicit_client.mjs URL TOOL ANSWER_JSON...
//
// It declares form elicitation, calls TOOL, answers each elicitation/create it gets with the
// next ANSWER_JSON (`{"action": ..., "content"?: ...}`), and prints one JSON line: what it was
// asked (message and requestedSchema, in order) and the call's result.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, tool, ...answers] = process.argv.slice(2);
const client = new Client(
  { name: "agent-lobby-test", version: "0.1.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push({ message: request.params.message, schema: request.params.requestedSchema });
  return JSON.parse(answers.shift() ?? '{"action": "cancel"}');
});

await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const result = await client.callTool({ name: tool, arguments: {} });
console.log(JSON.stringify({ asked, result }));
await client.close();
