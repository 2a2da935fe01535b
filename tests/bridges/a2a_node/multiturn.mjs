// A generic A2A client (@a2a-js/sdk) in a task over several turns with the lobby's A2A gateway:
// the lobby agent asks for input, the task waits in input-required, and a message naming the
// task answers it. Prints one JSON object of what it saw, for
// tests/bridges/test_a2a_tasks.py to check.
//
//   node multiturn.mjs AGENT_URL TOKEN
//
// AGENT_URL is the gateway's URL of an agent that asks for a size (`{"question": ...}`) and
// answers `{"item", "size"}`.
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory } from "@a2a-js/sdk/client";
import { Role, taskStateToJSON } from "@a2a-js/sdk";

const [agentUrl, token] = process.argv.slice(2);

function withToken(bearer) {
  return (url, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set("Authorization", `Bearer ${bearer}`);
    return fetch(url, { ...init, headers });
  };
}

const transports = [new JsonRpcTransportFactory({ fetchImpl: withToken(token) })];
const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { transports }));
const client = await factory.createFromUrl(agentUrl);

// A text part that is a JSON object is the lobby payload.
function message(payload, task) {
  const msg = {
    messageId: crypto.randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: JSON.stringify(payload) } }],
  };
  if (task) {
    msg.taskId = task.id;
    msg.contextId = task.contextId;
  }
  return { message: msg };
}

function dataOf(parts) {
  return parts.filter((p) => p.content?.$case === "data").map((p) => p.content.value);
}

function stateOf(task) {
  return taskStateToJSON(task.status.state);
}

const seen = {};
const asked = await client.sendMessage(message({ item: "shirt" }));
seen.asked = { state: stateOf(asked), question: dataOf(asked.status.message?.parts ?? []) };
seen.got = stateOf(await client.getTask({ id: asked.id }));
const done = await client.sendMessage(message({ size: "M" }, asked));
seen.answered = { sameTask: done.id === asked.id, state: stateOf(done), artifacts: done.artifacts.map((a) => dataOf(a.parts)) };

// The same over a stream: the first turn's events end in input-required, the second's in completed.
const turns = [];
let task = null;
for (const payload of [{ item: "coat" }, { size: "L" }]) {
  const states = [];
  for await (const event of client.sendMessageStream(message(payload, task))) {
    const { $case, value } = event.payload;
    if ($case === "task") task = value;
    if ($case === "statusUpdate") states.push(taskStateToJSON(value.status.state));
  }
  turns.push(states.at(-1));
}
seen.streamedTurns = turns;

// A task left waiting is cancelled.
const waiting = await client.sendMessage(message({ item: "scarf" }));
seen.cancelled = stateOf(await client.cancelTask({ id: waiting.id }));

process.stdout.write(JSON.stringify(seen) + "\n");
