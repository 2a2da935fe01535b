// The Agent Lobby dashboard: one WebSocket to /admin, the token as its first message, then
// `observe`: the lobby pushes a snapshot, `message` events as it routes, and a `state` event
// every second. Everything shown is set as text (never as HTML): ids come from agents.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const RATE_POINTS = 120;
const MESSAGES_SHOWN = 50;

let socket = null;
let nextId = 1;
const waiting = new Map(); // command id -> callback for its answer
const rates = []; // messages/s, one point per state event
let lastState = null;

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
  request.id = nextId++;
  if (onAnswer) waiting.set(request.id, onAnswer);
  socket.send(JSON.stringify(request));
}

function connect(token) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  socket = new WebSocket(`${scheme}//${location.host}/admin?auth=message`);
  socket.onopen = () => {
    send({ command: "auth", token }, (answer) => {
      if (!answer.ok) return;
      $("login").hidden = true;
      $("main").hidden = false;
      $("status").textContent = "connected";
      send({ command: "observe" }, showSnapshot);
    });
  };
  socket.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if (data.ok === false) {
      $("login-error").textContent = data.error;
      $("status").textContent = `refused: ${data.code}`;
    }
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
  socket.onclose = (event) => {
    $("status").textContent = `disconnected (${event.code})`;
  };
}

function showSnapshot(snapshot) {
  if (!snapshot.ok) return;
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
    (row, a) => cell(row, a.agent_id),
    (row, a) => cell(row, a.online ? "online" : "offline", a.online ? "online" : "offline"),
    (row, a) => cell(row, a.capabilities.join(", ")),
  ]);
  fill("dialogues", state.dialogues, [
    (row, d) => cell(row, d.dialogue_id),
    (row, d) => cell(row, d.initiator),
    (row, d) => cell(row, d.responder),
    (row, d) => cell(row, d.state),
    (row, d) => cell(row, d.moves),
  ]);
  fill("conversations", state.conversations, [
    (row, c) => cell(row, c.conversation_id),
    (row, c) => cell(row, c.requester),
    (row, c) => cell(row, c.responder),
    (row, c) => cell(row, c.waiting),
  ]);
  fill("transactions", state.transactions.slice().reverse(), [
    (row, t) => cell(row, t.transaction_id),
    (row, t) => cell(row, t.kind),
    (row, t) => cell(row, t.buyer),
    (row, t) => cell(row, t.seller),
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

function outcome(message) {
  return message.refused ? `refused: ${message.refused.code}` : "routed";
}

function addMessage(message) {
  const body = $("messages").tBodies[0];
  const row = body.insertRow(0);
  cell(row, time(message.at));
  cell(row, message.sender_id);
  cell(row, message.receiver_id);
  cell(row, message.message_type);
  cell(row, message.conversation_id);
  cell(row, outcome(message), message.refused ? "refused" : "");
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
function showConversation(answer) {
  const viewer = $("viewer");
  viewer.replaceChildren();
  if (!answer.ok) {
    viewer.textContent = answer.error;
    return;
  }
  if (answer.messages.length === 0) {
    viewer.textContent = `no messages kept for ${answer.key} (the lobby keeps those routed while a dashboard is open)`;
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
    drawing.append(svg("text", { x, y: 16, "text-anchor": "middle", "font-weight": "bold" }, name));
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
    group.append(svg("text", { x: (from + to) / 2, y: y + 14, "text-anchor": "middle", fill: colour, "font-size": 10 }, detail.slice(0, 48)));
    const tooltip = svg("title", {}, `${m.sender_id} -> ${m.receiver_id}\n${detail}`);
    group.append(tooltip);
    drawing.append(group);
  });
  viewer.append(drawing);
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  $("login-error").textContent = "";
  connect($("token").value);
});

$("viewer-form").addEventListener("submit", (event) => {
  event.preventDefault();
  send({ command: "conversation", key: $("viewer-key").value.trim() }, showConversation);
});
