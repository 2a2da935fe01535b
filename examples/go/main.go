// An Agent Lobby agent in Go, written from PROTOCOL.md alone: the standard library and a
// minimal WebSocket client (websocket.go), no code shared with the Python SDK.
//
//	go run . [LOBBY_URL]        (default $LOBBY_URL, else ws://127.0.0.1:8765/)
//
// What it does (one JSON line on stdout per step):
//
//	registered   REGISTER (or resume with the token kept in a file) with a capability
//	             `reverse`, its REQUESTs delivered in the object form (arguments_form)
//	discovered   DISCOVER_SERVICES for `double` (served by an SDK agent)
//	called       REQUEST `double` with its arguments as one object; skips `in_progress`
//	served       answers a REQUEST for `reverse` from an SDK caller (at any time)
//	done         all of the above happened; exit 0
//
// On any failure it prints {"step": "failed", "error": ...} and exits 1.
// Settings (environment): GO_AGENT_ID (go_agent), GO_AGENT_CALLERS (go_caller: who may call
// `reverse`, comma-separated), GO_AGENT_TOKEN_FILE (<id>.token), DOUBLER_CAPABILITY (double),
// GO_AGENT_TIMEOUT_S (30).
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

const lobbyID = "global_lobby"

// Message is the envelope of every frame (PROTOCOL.md section 2).
type Message struct {
	SenderID       string         `json:"sender_id"`
	ReceiverID     string         `json:"receiver_id"`
	MessageType    string         `json:"message_type"`
	Payload        map[string]any `json:"payload"`
	ConversationID string         `json:"conversation_id,omitempty"`
	AuthToken      string         `json:"auth_token,omitempty"`
	MessageID      string         `json:"message_id,omitempty"`
	InReplyTo      string         `json:"in_reply_to,omitempty"`
}

type agent struct {
	id    string
	token string
	ws    *wsConn
}

func setting(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func step(name string, details map[string]any) {
	line := map[string]any{"step": name}
	for key, value := range details {
		line[key] = value
	}
	out, _ := json.Marshal(line)
	fmt.Println(string(out))
}

func fail(err error) {
	step("failed", map[string]any{"error": err.Error()})
	os.Exit(1)
}

func newID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// send writes a message with the agent's token and a message_id of its own (a refusal names it
// in in_reply_to, section 11).
func (a *agent) send(receiver, messageType string, payload map[string]any, conversation string) error {
	message := Message{
		SenderID: a.id, ReceiverID: receiver, MessageType: messageType, Payload: payload,
		ConversationID: conversation, AuthToken: a.token, MessageID: newID(),
	}
	text, err := json.Marshal(message)
	if err != nil {
		return err
	}
	return a.ws.WriteText(text)
}

func (a *agent) read() (Message, error) {
	var message Message
	text, err := a.ws.ReadText()
	if err != nil {
		return message, err
	}
	return message, json.Unmarshal(text, &message)
}

// register sends REGISTER, resuming with a kept token: a plain REGISTER for a registered id is
// refused with agent_id_taken (section 3).
func (a *agent) register(tokenFile string, callers []string) error {
	kept, _ := os.ReadFile(tokenFile)
	a.token = strings.TrimSpace(string(kept))
	reverse := map[string]any{
		"name":        "reverse",
		"description": "Reverses a text (served by a Go agent).",
		"input_schema": map[string]any{
			"type":       "object",
			"properties": map[string]any{"text": map[string]any{"type": "string"}},
			"required":   []string{"text"},
		},
		"output_schema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"text": map[string]any{"type": "string"}, "length": map[string]any{"type": "integer"},
			},
			"required": []string{"text", "length"},
		},
		"keywords":                 []string{"text", "go"},
		"authorized_requester_ids": callers,
		"arguments_form":           "object",
	}
	payload := map[string]any{"capabilities": []any{reverse}}
	if err := a.send(lobbyID, "REGISTER", payload, ""); err != nil {
		return err
	}
	ack, err := a.read()
	if err != nil {
		return err
	}
	if ack.MessageType != "REGISTER_ACK" {
		return fmt.Errorf("REGISTER refused: %v", ack.Payload["error"])
	}
	a.token, _ = ack.Payload["auth_token"].(string)
	if err := os.WriteFile(tokenFile, []byte(a.token), 0o600); err != nil {
		return err
	}
	step("registered", map[string]any{"agent_id": a.id, "status": ack.Payload["status"]})
	return nil
}

func reversed(text string) string {
	runes := []rune(text)
	for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
		runes[i], runes[j] = runes[j], runes[i]
	}
	return string(runes)
}

// run registers, then reacts to each frame until it has called `double` and served `reverse`.
func (a *agent) run(doubler string, callers []string, tokenFile string) error {
	if err := a.register(tokenFile, callers); err != nil {
		return err
	}
	search, call := "discover-"+newID(), "call-"+newID()
	if err := a.send(lobbyID, "DISCOVER_SERVICES", map[string]any{"capability_name": doubler}, search); err != nil {
		return err
	}
	progress, called, served := 0, false, false
	for !called || !served {
		m, err := a.read()
		if err != nil {
			return err
		}
		switch {
		case m.MessageType == "ERROR":
			return fmt.Errorf("%v: %v", m.Payload["code"], m.Payload["error"])
		case m.MessageType == "SERVICES_AVAILABLE" && m.ConversationID == search:
			found, _ := m.Payload["services_found"].([]any)
			if len(found) == 0 {
				return fmt.Errorf("nobody offers %s", doubler)
			}
			service := found[0].(map[string]any)
			capability := service["relevant_capabilities"].([]any)[0].(map[string]any)
			step("discovered", map[string]any{
				"agent_id": service["agent_id"], "input_schema": capability["input_schema"],
			})
			// The object form: arguments in one object, which typed clients keep (section 5).
			request := map[string]any{"capability_name": doubler, "arguments": map[string]any{"n": 21}}
			if err := a.send(service["agent_id"].(string), "REQUEST", request, call); err != nil {
				return err
			}
		case m.MessageType == "RESPONSE" && m.ConversationID == call:
			if m.Payload["status"] == "in_progress" {
				progress++
				continue
			}
			if m.Payload["status"] != "success" {
				return fmt.Errorf("double failed: %v", m.Payload["error"])
			}
			step("called", map[string]any{
				"agent_id": m.SenderID, "progress": progress, "result": map[string]any{"n": m.Payload["n"]},
			})
			called = true
		case m.MessageType == "REQUEST" && m.Payload["capability_name"] == "reverse":
			arguments, _ := m.Payload["arguments"].(map[string]any)
			text, _ := arguments["text"].(string)
			answer := map[string]any{"status": "success", "text": reversed(text), "length": len([]rune(text))}
			if err := a.send(m.SenderID, "RESPONSE", answer, m.ConversationID); err != nil {
				return err
			}
			step("served", map[string]any{"requester": m.SenderID, "text": answer["text"]})
			served = true
		}
	}
	step("done", nil)
	return nil
}

func main() {
	url := setting("LOBBY_URL", "ws://127.0.0.1:8765/")
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	id := setting("GO_AGENT_ID", "go_agent")
	callers := strings.Split(setting("GO_AGENT_CALLERS", "go_caller"), ",")
	seconds, err := strconv.Atoi(setting("GO_AGENT_TIMEOUT_S", "30"))
	if err != nil {
		fail(err)
	}
	ws, err := dial(url)
	if err != nil {
		fail(err)
	}
	defer ws.Close()
	ws.conn.SetDeadline(time.Now().Add(time.Duration(seconds) * time.Second))
	a := &agent{id: id, ws: ws}
	if err := a.run(setting("DOUBLER_CAPABILITY", "double"), callers, setting("GO_AGENT_TOKEN_FILE", id+".token")); err != nil {
		fail(err)
	}
}
