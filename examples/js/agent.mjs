// An Agent Lobby agent in Node.js, written from PROTOCOL.md alone: raw JSON over the `ws`
// package, no code shared with the Python SDK.
//
//   node agent.mjs [LOBBY_URL]        (default $LOBBY_URL, else ws://127.0.0.1:8765/)
//
// What it does, in order (one JSON line on stdout per step):
//   registered   REGISTER (or resume with the token it kept for this lobby) with a capability
//                `reverse`
//   discovered   DISCOVER_SERVICES for `double` (served by an SDK agent)
//   called       REQUEST `double`; skips `in_progress` RESPONSEs, returns the final one
//   served       answers a REQUEST for `reverse` from an SDK caller (at any time)
//   haggle       CFP to an SDK seller, counter-PROPOSE until the price is right, ACCEPT,
//                then MATCH_ACCEPT and TRANSACTION_CONFIRMED from the lobby
//   done         everything above happened; exit 0
// On any failure it prints {"step": "failed", "error": ...} and exits 1.
//
// Settings (environment): JS_AGENT_ID (js_agent), JS_AGENT_CALLERS (js_caller: who may call
// `reverse`, comma-separated), DOUBLER_CAPABILITY (double), SELLER_ID (s), MAX_PRICE (15),
// OPENING_BID (10), JS_AGENT_TIMEOUT_S (30); AGENT_LOBBY_STATE_DIR, XDG_STATE_HOME (where the
// token is kept, as the Python SDK keeps its own: see `tokenFile` below).

import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, isAbsolute, join } from "node:path";
import WebSocket from "ws";

const LOBBY = "global_lobby";
const env = process.env;
const agentId = env.JS_AGENT_ID ?? "js_agent";
const settings = {
  url: process.argv[2] ?? env.LOBBY_URL ?? "ws://127.0.0.1:8765/",
  callers: (env.JS_AGENT_CALLERS ?? "js_caller").split(",").filter(Boolean),
  doubler: env.DOUBLER_CAPABILITY ?? "double",
  seller: env.SELLER_ID ?? "s",
  maxPrice: Number(env.MAX_PRICE ?? 15),
  openingBid: Number(env.OPENING_BID ?? 10),
  timeoutMs: 1000 * Number(env.JS_AGENT_TIMEOUT_S ?? 30),
};

// The capability this agent offers. input_schema describes the arguments (the REQUEST payload
// beside capability_name); output_schema the fields a success RESPONSE carries next to status.
const REVERSE = {
  name: "reverse",
  description: "Reverses a text (served by a Node.js agent).",
  input_schema: {
    type: "object",
    properties: { text: { type: "string" } },
    required: ["text"],
  },
  output_schema: {
    type: "object",
    properties: { text: { type: "string" }, length: { type: "integer" } },
    required: ["text", "length"],
  },
  keywords: ["text", "javascript"],
  authorized_requester_ids: settings.callers,
};

// A token is good only at the lobby that issued it (PROTOCOL.md section 3): it is kept under
// that lobby's identity, which the lobby announces in the handshake (header Agent-Lobby-Id) and
// in REGISTER_ACK (lobby_identity), and offered to no lobby announcing another one, even at the
// same address. The place is the Python SDK's (agent_sdk/identity.py):
// STATE/tokens/<lobby identity>/<agent id>.token, STATE being $AGENT_LOBBY_STATE_DIR, else
// $XDG_STATE_HOME/agent-lobby, else ~/.local/state/agent-lobby; a lobby that announces no
// identity (an older one) is known by the host_port of its URL instead.
const IDENTITY = /^[0-9a-z-]{8,64}$/;

function stateDir() {
  if (env.AGENT_LOBBY_STATE_DIR) return env.AGENT_LOBBY_STATE_DIR;
  const xdg = env.XDG_STATE_HOME;
  return join(xdg && isAbsolute(xdg) ? xdg : join(homedir(), ".local", "state"), "agent-lobby");
}

function lobbyKey(identity) {
  if (identity && IDENTITY.test(identity)) return identity;
  const url = new URL(settings.url);
  const port = url.port || (["wss:", "https:"].includes(url.protocol) ? "443" : "80");
  return `${url.hostname}_${port}`;
}

function tokenFile(identity) {
  // Percent-encoded as Python's quote(id, safe="-_.") does: a name, never a path.
  const name = encodeURIComponent(agentId).replace(
    /[!~*'()]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
  return join(stateDir(), "tokens", lobbyKey(identity), `${name}.token`);
}

function saveToken(path, token) {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const temporary = `${path}.${process.pid}.tmp`;
  writeFileSync(temporary, token, { mode: 0o600 });
  renameSync(temporary, path); // whole or not at all
}

function step(name, details = {}) {
  console.log(JSON.stringify({ step: name, ...details }));
}

function fail(error) {
  step("failed", { error: String(error?.message ?? error) });
  process.exit(1);
}

class LobbyConnection {
  // One WebSocket to the lobby. Incoming frames go to whoever waits for them (`next`), REQUESTs
  // to `onRequest`; ERRORs reject the waiter of their conversation.
  constructor(ws, identity) {
    this.ws = ws;
    this.identity = identity; // the lobby's, from the handshake; null if it announces none
    this.token = null;
    this.waiters = [];
    this.unclaimed = [];
    this.onRequest = null;
    ws.on("message", (data) => this.dispatch(JSON.parse(data.toString())));
    ws.on("close", (code) => {
      for (const w of this.waiters.splice(0)) w.reject(new Error(`connection closed (${code})`));
    });
  }

  static open(url) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url);
      let identity = null;
      ws.once("upgrade", (response) => {
        identity = response.headers["agent-lobby-id"] ?? null;
      });
      ws.once("open", () => resolve(new LobbyConnection(ws, identity)));
      ws.once("error", reject);
    });
  }

  // Every message carries its own message_id: a refusal names it in in_reply_to (PROTOCOL.md
  // section 11) and a resend of it is recognised (section 7).
  send(receiverId, messageType, payload, extra = {}) {
    const message = {
      sender_id: agentId,
      receiver_id: receiverId,
      message_type: messageType,
      payload,
      message_id: randomUUID(),
      ...(this.token ? { auth_token: this.token } : {}),
      ...extra,
    };
    this.ws.send(JSON.stringify(message));
    return message;
  }

  // The next message that `matches`; an ERROR in `conversationId` rejects instead.
  next(matches, conversationId = null) {
    const claims = (m) =>
      matches(m) || (m.message_type === "ERROR" && m.conversation_id === conversationId);
    const settle = (m, resolve, reject) =>
      m.message_type === "ERROR" && !matches(m)
        ? reject(new Error(`${m.payload.code}: ${m.payload.error}`))
        : resolve(m);
    return new Promise((resolve, reject) => {
      const index = this.unclaimed.findIndex(claims);
      if (index >= 0) return settle(this.unclaimed.splice(index, 1)[0], resolve, reject);
      this.waiters.push({ claims, resolve: (m) => settle(m, resolve, reject), reject });
    });
  }

  dispatch(message) {
    if (message.message_type === "REQUEST" && this.onRequest) {
      this.onRequest(message);
      return;
    }
    const index = this.waiters.findIndex((w) => w.claims(message));
    if (index >= 0) {
      this.waiters.splice(index, 1)[0].resolve(message);
    } else if (this.unclaimed.push(message) > 1000) {
      this.unclaimed.shift(); // nobody asked for it; keep the memory bounded
    }
  }

  // A final RESPONSE in `conversationId`: in_progress ones are progress reports, not answers.
  async finalResponse(conversationId, onProgress) {
    for (;;) {
      const reply = await this.next(
        (m) => m.message_type === "RESPONSE" && m.conversation_id === conversationId,
        conversationId,
      );
      if (reply.payload.status !== "in_progress") return reply;
      onProgress(reply.payload);
    }
  }
}

async function register(lobby) {
  // A token kept for this lobby resumes this agent: a plain REGISTER for a registered id is
  // refused with agent_id_taken. A token the lobby does not know (it lost its state) registers
  // anew. A token kept for another lobby is not looked at.
  const keptIn = tokenFile(lobby.identity);
  const kept = existsSync(keptIn) ? readFileSync(keptIn, "utf8").trim() : null;
  lobby.ws.send(
    JSON.stringify({
      sender_id: agentId,
      receiver_id: LOBBY,
      message_type: "REGISTER",
      payload: { capabilities: [REVERSE] },
      ...(kept ? { auth_token: kept } : {}),
    }),
  );
  const ack = await lobby.next((m) => ["REGISTER_ACK", "ERROR"].includes(m.message_type));
  if (ack.message_type === "ERROR") throw new Error(`REGISTER refused: ${ack.payload.code}`);
  lobby.token = ack.payload.auth_token;
  saveToken(tokenFile(ack.payload.lobby_identity ?? lobby.identity), lobby.token);
  step("registered", { agent_id: agentId, status: ack.payload.status });
}

async function discoverAndCall(lobby) {
  const search = `discover-${randomUUID()}`;
  lobby.send(LOBBY, "DISCOVER_SERVICES", { capability_name: settings.doubler }, {
    conversation_id: search,
  });
  const found = await lobby.next(
    (m) => m.message_type === "SERVICES_AVAILABLE" && m.conversation_id === search,
    search,
  );
  const service = found.payload.services_found[0];
  if (!service) throw new Error(`nobody offers ${settings.doubler}`);
  const capability = service.relevant_capabilities[0];
  step("discovered", { agent_id: service.agent_id, input_schema: capability.input_schema });

  const call = randomUUID();
  lobby.send(service.agent_id, "REQUEST", { capability_name: settings.doubler, n: 21 }, {
    conversation_id: call,
  });
  const progress = [];
  const reply = await lobby.finalResponse(call, (update) => progress.push(update));
  const { status, ...result } = reply.payload;
  if (status !== "success") throw new Error(`${settings.doubler} failed: ${reply.payload.error}`);
  step("called", { agent_id: service.agent_id, progress: progress.length, result });
}

function serve(lobby) {
  // Answers REQUESTs for `reverse` (those that came before this was called too: a REQUEST may
  // arrive right behind REGISTER_ACK); resolves once one has been served successfully.
  return new Promise((resolve) => {
    lobby.onRequest = (request) => {
      const { capability_name: name, ...args } = request.payload;
      const answer = (payload) =>
        lobby.send(request.sender_id, "RESPONSE", payload, {
          conversation_id: request.conversation_id,
          in_reply_to: request.message_id, // optional: the lobby matches by conversation_id
        });
      if (name !== REVERSE.name) {
        answer({
          status: "error",
          code: "capability_not_found",
          error: `Capability '${name}' not found on agent '${agentId}'.`,
        });
      } else if (typeof args.text !== "string") {
        answer({ status: "error", code: "invalid_input", error: "'text' must be a string" });
        step("refused", { requester: request.sender_id, code: "invalid_input" });
      } else {
        const text = [...args.text].reverse().join("");
        answer({ status: "success", text, length: text.length });
        step("served", { requester: request.sender_id, text });
        resolve();
      }
    };
    const early = lobby.unclaimed.filter((m) => m.message_type === "REQUEST");
    lobby.unclaimed = lobby.unclaimed.filter((m) => m.message_type !== "REQUEST");
    early.forEach(lobby.onRequest);
  });
}

async function haggle(lobby) {
  // The buyer's side of a FIPA dialogue: each move names the other party's latest move in
  // in_reply_to; our own moves carry our message_id, which the seller's replies name.
  const dialogue = `haggle-${randomUUID()}`;
  const seller = settings.seller;
  const fromSeller = (m) => m.conversation_id === dialogue && m.sender_id === seller;
  const cfp = lobby.send(seller, "CFP", { query: { goods: { r: 1 } } }, {
    conversation_id: dialogue,
  });
  step("cfp", { to: seller, dialogue });
  let latest = cfp;
  let bid = settings.openingBid;
  for (;;) {
    const move = await lobby.next(fromSeller, dialogue);
    if (move.in_reply_to !== latest.message_id) throw new Error("reply to an unknown move");
    if (move.message_type !== "PROPOSE") throw new Error(`seller answered ${move.message_type}`);
    const price = move.payload.proposal.price;
    step("proposal", { price });
    const moveIds = { conversation_id: dialogue, in_reply_to: move.message_id };
    if (price <= settings.maxPrice) {
      latest = lobby.send(seller, "ACCEPT", {}, moveIds);
      step("accept", { price });
      break;
    }
    latest = lobby.send(seller, "PROPOSE", { proposal: { goods: { r: 1 }, price: bid } }, moveIds);
    step("counter", { price: bid });
    bid = Math.min(settings.maxPrice, bid + 1);
  }
  const matched = await lobby.next(fromSeller, dialogue);
  if (matched.message_type !== "MATCH_ACCEPT" || matched.in_reply_to !== latest.message_id) {
    throw new Error(`expected MATCH_ACCEPT, got ${matched.message_type}`);
  }
  step("match_accept", {});
  const confirmed = await lobby.next(
    (m) => m.message_type === "TRANSACTION_CONFIRMED" && m.conversation_id === dialogue,
    dialogue,
  );
  step("transaction_confirmed", { transaction: confirmed.payload.transaction });
}

async function main() {
  setTimeout(() => fail(`not done within ${settings.timeoutMs} ms`), settings.timeoutMs).unref();
  const lobby = await LobbyConnection.open(settings.url);
  await register(lobby);
  const served = serve(lobby);
  await discoverAndCall(lobby);
  await haggle(lobby);
  await served;
  step("done");
  lobby.ws.close(1000);
}

main().catch(fail);
