package main

// A minimal WebSocket client (RFC 6455): the opening handshake, masked text frames out, text
// messages in (fragments joined), pings answered, a close echoed. Go's standard library has
// no WebSocket, and this agent uses nothing else.

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

const handshakeGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" // RFC 6455 section 1.3

type wsConn struct {
	conn   net.Conn
	reader *bufio.Reader
}

// dial opens ws://host:port/path and completes the opening handshake.
func dial(rawURL string) (*wsConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "ws" {
		return nil, fmt.Errorf("not a ws:// URL: %q", rawURL)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	key := base64.StdEncoding.EncodeToString(nonce)
	path := u.RequestURI()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", path, u.Host, key)
	reader := bufio.NewReader(conn)
	response, err := http.ReadResponse(reader, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	digest := sha1.Sum([]byte(key + handshakeGUID))
	accept := base64.StdEncoding.EncodeToString(digest[:])
	if response.StatusCode != http.StatusSwitchingProtocols ||
		response.Header.Get("Sec-WebSocket-Accept") != accept {
		conn.Close()
		return nil, fmt.Errorf("handshake refused: %s", response.Status)
	}
	return &wsConn{conn, reader}, nil
}

// writeFrame sends one final frame; a client masks every frame it sends (section 5.3).
func (ws *wsConn) writeFrame(opcode byte, payload []byte) error {
	header := []byte{0x80 | opcode}
	switch n := len(payload); {
	case n < 126:
		header = append(header, 0x80|byte(n))
	case n <= 0xFFFF:
		header = append(header, 0x80|126, byte(n>>8), byte(n))
	default:
		header = append(header, 0x80|127)
		header = binary.BigEndian.AppendUint64(header, uint64(n))
	}
	mask := make([]byte, 4)
	if _, err := rand.Read(mask); err != nil {
		return err
	}
	masked := make([]byte, len(payload))
	for i, b := range payload {
		masked[i] = b ^ mask[i%4]
	}
	_, err := ws.conn.Write(append(append(header, mask...), masked...))
	return err
}

func (ws *wsConn) WriteText(text []byte) error { return ws.writeFrame(0x1, text) }

// ReadText returns the next whole text message, answering pings on the way.
func (ws *wsConn) ReadText() ([]byte, error) {
	var message []byte
	for {
		var head [2]byte
		if _, err := io.ReadFull(ws.reader, head[:]); err != nil {
			return nil, err
		}
		final, opcode, length := head[0]&0x80 != 0, head[0]&0x0F, uint64(head[1]&0x7F)
		if head[1]&0x80 != 0 {
			return nil, errors.New("a server must not mask its frames")
		}
		if length >= 126 {
			extended := make([]byte, map[uint64]int{126: 2, 127: 8}[length])
			if _, err := io.ReadFull(ws.reader, extended); err != nil {
				return nil, err
			}
			length = 0
			for _, b := range extended {
				length = length<<8 | uint64(b)
			}
		}
		payload := make([]byte, length)
		if _, err := io.ReadFull(ws.reader, payload); err != nil {
			return nil, err
		}
		switch opcode {
		case 0x8: // close: echo its code, then the connection is over
			ws.writeFrame(0x8, payload[:min(len(payload), 2)])
			return nil, fmt.Errorf("closed by the lobby: %s", closeReason(payload))
		case 0x9:
			if err := ws.writeFrame(0xA, payload); err != nil {
				return nil, err
			}
		case 0xA: // an unsolicited pong: nothing to do
		case 0x1, 0x0:
			message = append(message, payload...)
			if final {
				return message, nil
			}
		default:
			return nil, fmt.Errorf("unexpected opcode %d", opcode)
		}
	}
}

// Close sends a normal close (1000) and closes the socket.
func (ws *wsConn) Close() error {
	ws.writeFrame(0x8, []byte{0x03, 0xE8})
	return ws.conn.Close()
}

func closeReason(payload []byte) string {
	if len(payload) < 2 {
		return "no status"
	}
	code := binary.BigEndian.Uint16(payload)
	return strings.TrimSpace(fmt.Sprintf("%d %s", code, payload[2:]))
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}
