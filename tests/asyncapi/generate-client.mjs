// Generate agent-side WebSocket clients from an AsyncAPI document with @asyncapi/generator's
// baked-in client templates, as a team writing an agent would:
//
//   node tests/asyncapi/generate-client.mjs protocol/asyncapi-agent.json OUT_DIR [TARGET...]
//
// writes OUT_DIR/python (client.py, its models, requirements.txt) and OUT_DIR/javascript
// (client.js), or only the TARGETs named. Offline: baked-in templates ship inside the generator
// package, so it installs nothing; it transpiles them in place on first use.
import Generator from "@asyncapi/generator";

const TEMPLATES = {
  python: "core-template-client-websocket-python",
  javascript: "core-template-client-websocket-javascript",
};

const [source, out, ...targets] = process.argv.slice(2);
if (!source || !out) {
  console.error("usage: node generate-client.mjs ASYNCAPI_FILE OUT_DIR [python|javascript...]");
  process.exit(2);
}
for (const target of targets.length ? targets : Object.keys(TEMPLATES)) {
  const template = TEMPLATES[target];
  if (!template) {
    console.error(`unknown target ${target}: one of ${Object.keys(TEMPLATES).join(", ")}`);
    process.exit(2);
  }
  // `server` names the document's server whose URL becomes the client's default.
  const generator = new Generator(template, `${out}/${target}`, {
    templateParams: { server: "local" },
    forceWrite: true,
  });
  await generator.generateFromFile(source);
}
