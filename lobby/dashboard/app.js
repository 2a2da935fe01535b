// The Agent Lobby dashboard: one WebSocket to /admin, the token as its first message, then
// `observe`: the lobby pushes a snapshot, `message` events as it routes, and a `state` event
// every second. When the lobby goes away (a restart) the page reconnects with backoff and
// the same token. Everything shown is set as text (never as HTML): ids come from agents.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const RATE_POINTS = 120;
const MESSAGES_SHOWN = 50;
const CONVERSATIONS_PER_AGENT = 50;
// Delivery bookkeeping, hidden from "Recent messages" unless asked for (a refused one shows).
const BOOKKEEPING = new Set(["ACK", "ACCEPTED", "FETCH_MESSAGES", "MESSAGES"]);
const RETRY_FIRST = 0.5; // seconds before the first reconnection, doubled up to RETRY_MAX
const RETRY_MAX = 10;

let socket = null;
let token = null; // kept in memory only, to reconnect after a restart
let authenticated = false; // this socket proved the token (a close then means: reconnect)
let retries = 0;
let nextId = 1;
const waiting = new Map(); // command id -> callback for its answer
const rates = []; // messages/s, one point per state event
let lastState = null;
let viewing = null; // the id in the viewer, redrawn as its messages come
let redraw = null;
const conversationsOf = new Map(); // agent id -> conversation ids seen, latest last

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (className) td.className = className;
  return td;
}

function fill(tableId, items, columns) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const item of items) {
    const row = body.insertRow();
    for (const column of columns) column(row, item);
  }
}

function send(request, onAnswer) {
  if (socket === null || socket.readyState !== WebSocket.OPEN) return; // reconnecting: asked again then
  request.id = nextId++;
  if (onAnswer) waiting.set(request.id, onAnswer);
  socket.send(JSON.stringify(request));
}

// A link that opens `key` in the viewer: agent ids list their conversations, the others
// (conversation, dialogue, trace ids) draw the sequence diagram.
function link(parent, key, kind) {
  if (!key) return;
  const a = document.createElement("a");
  a.href = "#viewer";
  a.className = `id ${kind}`;
  a.textContent = key;
  a.addEventListener("click", (event) => {
    event.preventDefault();
    if (kind === "agent") showAgent(key);
    else view(key);
  });
  parent.append(a);
}

function idCell(row, key, kind) {
  const td = row.insertCell();
  link(td, key, kind);
  return td;
}

// Backoff as websockets' client does it: a jittered first delay, then doubling, capped.
function retryDelay() {
  const delay = Math.min(RETRY_MAX, RETRY_FIRST * 2 ** retries) * (0.5 + Math.random() / 2);
  retries += 1;
  return delay;
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const current = new WebSocket(`${scheme}//${location.host}/admin?auth=message`);
  socket = current;
  authenticated = false;
  current.onopen = () => {
    send({ command: "auth", token }, (answer) => {
      if (!answer.ok) {
        // Wrong token (or rotated while the page was open): ask for it, do not retry.
        token = null;
        $("login").hidden = false;
        $("login-error").textContent = answer.error;
        $("status").textContent = "wrong admin token";
        return;
      }
      authenticated = true;
      retries = 0;
      $("login").hidden = true;
      $("main").hidden = false;
      $("status").textContent = "connected";
      send({ command: "observe" }, showSnapshot);
      if (viewing !== null) view(viewing);
    });
  };
  current.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if (data.id !== undefined && waiting.has(data.id)) {
      const onAnswer = waiting.get(data.id);
      waiting.delete(data.id);
      onAnswer(data);
    } else if (data.event === "message") {
      addMessage(data.message);
    } else if (data.event === "state") {
      showState(data);
    }
  };
  current.onclose = (event) => {
    if (socket !== current) return;
    waiting.clear();
    if (token === null) return; // refused: the login form says why
    const delay = retryDelay();
    const why = authenticated ? "lobby closed the connection" : "lobby unreachable";
    $("status").textContent = `${why} (${event.code}): reconnecting in ${delay.toFixed(1)} s`;
    setTimeout(connect, delay * 1000);
  };
}

function showSnapshot(snapshot) {
  if (!snapshot.ok) return;
  // A snapshot after a reconnection starts afresh: the lobby's counters may have restarted.
  lastState = null;
  $("messages").tBodies[0].replaceChildren();
  showState(snapshot);
  for (const message of snapshot.recent) addMessage(message);
}

function showState(state) {
  if (lastState !== null && state.at > lastState.at) {
    rates.push((state.routed - lastState.routed) / (state.at - lastState.at));
    if (rates.length > RATE_POINTS) rates.shift();
    $("rate").textContent = rates[rates.length - 1].toFixed(1);
    drawChart();
  }
  lastState = state;
  $("agents-count").textContent = state.agents_total;
  $("online-count").textContent = state.agents.filter((a) => a.online).length;
  $("connections").textContent = state.connections;
  $("routed").textContent = state.routed;
  $("refused").textContent = state.refused;
  fill("agents", state.agents, [
    (row, a) => idCell(row, a.agent_id, "agent"),
    (row, a) => cell(row, a.online ? "online" : "offline", a.online ? "online" : "offline"),
    (row, a) => cell(row, a.capabilities.join(", ")),
  ]);
  fill("dialogues", state.dialogues, [
    (row, d) => idCell(row, d.dialogue_id, "conversation"),
    (row, d) => idCell(row, d.initiator, "agent"),
    (row, d) => idCell(row, d.responder, "agent"),
    (row, d) => cell(row, d.state),
    (row, d) => cell(row, d.moves),
  ]);
  fill("conversations", state.conversations, [
    (row, c) => idCell(row, c.conversation_id, "conversation"),
    (row, c) => idCell(row, c.requester, "agent"),
    (row, c) => idCell(row, c.responder, "agent"),
    (row, c) => cell(row, c.waiting),
  ]);
  fill("transactions", state.transactions.slice().reverse(), [
    (row, t) => cell(row, t.transaction_id),
    (row, t) => cell(row, t.kind),
    (row, t) => idCell(row, t.buyer, "agent"),
    (row, t) => idCell(row, t.seller, "agent"),
    (row, t) => cell(row, t.amount),
    (row, t) => cell(row, t.reference),
  ]);
}

function drawChart() {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const top = Math.max(1, ...rates);
  ctx.strokeStyle = "#2b6cb0";
  ctx.lineWidth = 2;
  ctx.beginPath();
  rates.forEach((rate, i) => {
    const x = (i / (RATE_POINTS - 1)) * width;
    const y = height - 4 - (rate / top) * (height - 20);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#555";
  ctx.font = "12px sans-serif";
  ctx.fillText(`max ${top.toFixed(1)} msg/s`, 4, 12);
}

function time(at) {
  return new Date(at * 1000).toISOString().slice(11, 23);
}

function bookkeeping(message) {
  return BOOKKEEPING.has(message.message_type) && !message.refused;
}

function remember(agentId, conversationId) {
  if (!agentId || !conversationId) return;
  const ids = conversationsOf.get(agentId) || [];
  const at = ids.indexOf(conversationId);
  if (at >= 0) ids.splice(at, 1);
  ids.push(conversationId);
  if (ids.length > CONVERSATIONS_PER_AGENT) ids.shift();
  conversationsOf.set(agentId, ids);
}

function addMessage(message) {
  remember(message.sender_id, message.conversation_id);
  remember(message.receiver_id, message.conversation_id);
  if (viewing !== null && (message.conversation_id === viewing || message.trace_id === viewing)) {
    clearTimeout(redraw); // at most one redraw per burst of messages
    redraw = setTimeout(() => viewing !== null && view(viewing), 100);
  }
  const body = $("messages").tBodies[0];
  const row = body.insertRow(0);
  row.dataset.type = message.message_type;
  if (bookkeeping(message)) row.className = "bookkeeping";
  cell(row, time(message.at));
  idCell(row, message.sender_id, "agent");
  idCell(row, message.receiver_id, "agent");
  cell(row, message.message_type);
  idCell(row, message.conversation_id, "conversation");
  if (message.refused) {
    const td = cell(row, `refused: ${message.refused.code}: ${message.refused.error}`, "refused reason");
    td.title = `${message.refused.code}: ${message.refused.error}`; // whole, however long
  } else {
    cell(row, "routed");
  }
  while (body.rows.length > MESSAGES_SHOWN) body.deleteRow(-1);
}

function svg(name, attributes, text) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

// A sequence diagram: one lifeline per party, one arrow per message, top to bottom; a refused
// message ends in a cross at the lobby's lifeline with the reason.
function view(key) {
  viewing = key;
  $("viewer-key").value = key;
  send({ command: "conversation", key }, showConversation);
}

// What the lobby's state says of an id it kept no messages for.
function known(key) {
  if (lastState === null) return "";
  const d = lastState.dialogues.find((x) => x.dialogue_id === key);
  if (d) return ` It is an open dialogue between ${d.initiator} and ${d.responder} (${d.state}, ${d.moves} moves).`;
  const c = lastState.conversations.find((x) => x.conversation_id === key);
  if (c) return ` It is an open conversation between ${c.requester} and ${c.responder}.`;
  return "";
}

// An agent's conversations, as this page saw them and as the lobby lists them open.
function showAgent(agentId) {
  viewing = null;
  const viewer = $("viewer");
  viewer.replaceChildren();
  const ids = (conversationsOf.get(agentId) || []).slice().reverse();
  if (lastState !== null) {
    for (const d of lastState.dialogues)
      if ((d.initiator === agentId || d.responder === agentId) && !ids.includes(d.dialogue_id)) ids.push(d.dialogue_id);
    for (const c of lastState.conversations)
      if ((c.requester === agentId || c.responder === agentId) && !ids.includes(c.conversation_id)) ids.push(c.conversation_id);
  }
  const title = document.createElement("h3");
  title.textContent = `Conversations of ${agentId}`;
  viewer.append(title);
  if (ids.length === 0) {
    viewer.append(`none seen since this page connected`);
    return;
  }
  const list = document.createElement("ul");
  list.id = "agent-conversations";
  for (const id of ids) {
    const item = document.createElement("li");
    link(item, id, "conversation");
    list.append(item);
  }
  viewer.append(list);
}

function showConversation(answer) {
  const viewer = $("viewer");
  if (answer.ok && answer.key !== viewing) return; // an answer for an id no longer shown
  viewer.replaceChildren();
  if (!answer.ok) {
    viewer.textContent = answer.error;
    return;
  }
  if (answer.messages.length === 0) {
    viewer.textContent =
      `No messages kept for ${answer.key} yet: the lobby keeps the messages it routes while a dashboard ` +
      `is open, so a conversation that began before shows from its next message on (drawn here as it comes).` +
      known(answer.key);
    return;
  }
  const parties = [];
  const party = (id) => {
    const name = id || "?";
    if (!parties.includes(name)) parties.push(name);
    return parties.indexOf(name);
  };
  party("global_lobby");
  for (const m of answer.messages) {
    party(m.sender_id);
    party(m.receiver_id);
  }
  const column = 200;
  const rowHeight = 44;
  const width = column * parties.length;
  const height = 60 + rowHeight * answer.messages.length;
  const drawing = svg("svg", { width, height, id: "sequence" });
  parties.forEach((name, i) => {
    const x = column * i + column / 2;
    const head = svg("text", { x, y: 16, "text-anchor": "middle", "font-weight": "bold", class: "party" }, name);
    head.addEventListener("click", () => showAgent(name)); // a party is an agent: its conversations
    drawing.append(head);
    drawing.append(svg("line", { x1: x, y1: 24, x2: x, y2: height, stroke: "#bbb", "stroke-dasharray": "4 3" }));
  });
  const marker = svg("marker", { id: "arrow", markerWidth: 8, markerHeight: 8, refX: 8, refY: 4, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L8,4 L0,8 z", fill: "#333" }));
  drawing.append(marker);
  answer.messages.forEach((m, i) => {
    const y = 56 + rowHeight * i;
    const from = column * party(m.sender_id) + column / 2;
    const target = m.refused ? party("global_lobby") : party(m.receiver_id);
    const to = column * target + column / 2;
    const colour = m.refused ? "#b3261e" : "#333";
    const group = svg("g", { class: "move", "data-type": m.message_type });
    group.append(svg("line", { x1: from, y1: y, x2: to, y2: y, stroke: colour, "marker-end": "url(#arrow)" }));
    const label = `${m.message_type} ${time(m.at)}`;
    group.append(svg("text", { x: (from + to) / 2, y: y - 6, "text-anchor": "middle", fill: colour }, label));
    const detail = m.refused ? `refused ${m.refused.code}: ${m.refused.error}` : m.payload || "";
    const shown = detail.length > 48 ? `${detail.slice(0, 47)}…` : detail; // whole in the title
    group.append(svg("text", { x: (from + to) / 2, y: y + 14, "text-anchor": "middle", fill: colour, "font-size": 10 }, shown));
    const tooltip = svg("title", {}, `${m.sender_id} -> ${m.receiver_id}\n${detail}`);
    group.append(tooltip);
    drawing.append(group);
  });
  viewer.append(drawing);
  // The traces its messages belong to (W3C trace ids), each opening the messages of that trace.
  const traces = [...new Set(answer.messages.map((m) => m.trace_id).filter((t) => t && t !== answer.key))];
  if (traces.length > 0) {
    const line = document.createElement("p");
    line.className = "traces";
    line.append("traces: ");
    for (const trace of traces) {
      link(line, trace, "trace");
      line.append(" ");
    }
    viewer.append(line);
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  $("login-error").textContent = "";
  token = $("token").value;
  retries = 0;
  if (socket !== null) {
    const old = socket;
    socket = null; // its close is not a reason to reconnect
    old.close();
  }
  connect();
});

$("viewer-form").addEventListener("submit", (event) => {
  event.preventDefault();
  view($("viewer-key").value.trim());
});

$("show-bookkeeping").addEventListener("change", (event) => {
  $("messages").classList.toggle("show-bookkeeping", event.target.checked);
});
