// A generic A2A client (@a2a-js/sdk) against the lobby's A2A gateway, as any A2A user would
// write it: the card resolved from a URL, messages that name no skill. Prints one JSON object
// of what it saw, for tests/bridges/test_a2a.py to check.
//
//   node client.mjs GATEWAY_URL TOKEN MANY_AGENT_ID
//
// GATEWAY_URL serves a default agent at its origin; MANY_AGENT_ID offers several capabilities.
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory } from "@a2a-js/sdk/client";
import { Role, taskStateToJSON } from "@a2a-js/sdk";

const [gateway, token, many] = process.argv.slice(2);

// The bearer token on every request but the card's, which is public.
function withToken(bearer) {
  return (url, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set("Authorization", `Bearer ${bearer}`);
    return fetch(url, { ...init, headers });
  };
}

function factory(bearer) {
  const transports = [new JsonRpcTransportFactory({ fetchImpl: withToken(bearer) })];
  return new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { transports }));
}

function message(text) {
  return {
    message: {
      messageId: crypto.randomUUID(),
      role: Role.ROLE_USER,
      parts: [{ content: { $case: "text", value: text } }],
    },
  };
}

function dataOf(parts) {
  return parts.filter((p) => p.content?.$case === "data").map((p) => p.content.value);
}

async function failure(promise) {
  try {
    await promise;
    return null;
  } catch (error) {
    return { name: error.name, message: error.message, code: error.envelopeCode ?? null };
  }
}

const seen = {};
const client = await factory(token).createFromUrl(gateway);
seen.card = (await client.getAgentCard()).name;
// The same gateway URL with its trailing slash.
const slashed = await factory(token).createFromUrl(`${gateway.replace(/\/+$/, "")}/`);
seen.cardWithSlash = (await slashed.getAgentCard()).name;

const task = await client.sendMessage(message("hi"));
seen.sent = { state: taskStateToJSON(task.status.state), artifacts: task.artifacts.map((a) => dataOf(a.parts)) };

const events = [];
for await (const event of client.sendMessageStream(message("yo"))) {
  const { $case, value } = event.payload;
  if ($case === "statusUpdate") {
    const state = taskStateToJSON(value.status.state);
    events.push({ kind: $case, state, data: dataOf(value.status.message?.parts ?? []) });
  } else if ($case === "artifactUpdate") {
    events.push({ kind: $case, data: dataOf(value.artifact.parts) });
  } else {
    events.push({ kind: $case });
  }
}
seen.streamed = events;

// A message naming no skill to an agent with several capabilities: no default to call.
const manyAgent = await factory(token).createFromUrl(`${gateway.replace(/\/+$/, "")}/agents/${many}/`);
seen.noDefault = await failure(manyAgent.sendMessage(message("hi")));
// A token the gateway does not know: 401, its body a JSON-RPC error.
const stranger = await factory("not-a-token").createFromUrl(gateway);
seen.badToken = await failure(stranger.sendMessage(message("hi")));

process.stdout.write(JSON.stringify(seen) + "\n");
