"""WebSocket conformance: Autobahn|Testsuite's fuzzing client against each lobby transport and a
plain websockets server (`make conformance`, docs/conformance.md). Not collected by pytest."""
