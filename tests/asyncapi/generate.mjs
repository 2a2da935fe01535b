// Generate models from an AsyncAPI document with the AsyncAPI project's own generator library
// (Modelina), as a team writing an agent in another language would:
//
//   node tests/asyncapi/generate.mjs protocol/asyncapi-agent.json OUT_DIR
//
// writes OUT_DIR/ts (TypeScript classes that marshal and unmarshal themselves),
// OUT_DIR/python/asyncapimodels (pydantic models) and OUT_DIR/go (structs with JSON tags).
import { readFile } from "node:fs/promises";
import {
  GoFileGenerator,
  GO_COMMON_PRESET,
  PythonFileGenerator,
  PYTHON_PYDANTIC_PRESET,
  TypeScriptFileGenerator,
  TS_COMMON_PRESET,
} from "@asyncapi/modelina";

const [source, out] = process.argv.slice(2);
if (!source || !out) {
  console.error("usage: node generate.mjs ASYNCAPI_FILE OUT_DIR");
  process.exit(2);
}
const document = JSON.parse(await readFile(source, "utf8"));
const typescript = new TypeScriptFileGenerator({
  modelType: "class",
  presets: [{ preset: TS_COMMON_PRESET, options: { marshalling: true } }],
});
const ts = await typescript.generateToFiles(document, `${out}/ts`, { exportType: "named" });
const python = new PythonFileGenerator({ presets: [PYTHON_PYDANTIC_PRESET] });
const py = await python.generateToFiles(document, `${out}/python/asyncapimodels`, {});
// Modelina 5.10's Go union fields get a tag without its closing quote (`json:"-,omitempty`),
// which `go vet` refuses: written whole here. Union structs marshal nothing either way; the
// document keeps them to AgentFrame/LobbyFrame and the operations' replies, which a Go client
// dispatches on by message_type rather than decodes.
const GO_UNION_TAG = {
  union: { field: ({ content }) => content.replace('`json:"-,omitempty`', '`json:"-"`') },
};
// Modelina's Go structs put the fields a schema leaves open (`additionalProperties`: a REQUEST's
// flat arguments, a RESPONSE's output) in a map that encoding/json skips. This preset, the Go
// counterpart of TypeScript's marshalling one, reads them into that map and writes them back.
const GO_ADDITIONAL_PROPERTIES = {
  struct: {
    self({ content, model, renderer }) {
      const fields = Object.values(model.properties);
      const open = fields.find((f) => f.property.serializationType === "unwrap");
      if (!open) return content;
      renderer.dependencyManager.addDependency("encoding/json");
      const known = fields
        .filter((f) => f !== open)
        .map((f) => JSON.stringify(f.unconstrainedPropertyName))
        .join(", ");
      const name = model.name;
      const extra = open.propertyName;
      return `${content}

func (m *${name}) UnmarshalJSON(raw []byte) error {
  type plain ${name}
  if err := json.Unmarshal(raw, (*plain)(m)); err != nil {
    return err
  }
  var all map[string]interface{}
  if err := json.Unmarshal(raw, &all); err != nil {
    return err
  }
  for _, key := range []string{${known}} {
    delete(all, key)
  }
  m.${extra} = nil
  if len(all) > 0 {
    m.${extra} = all
  }
  return nil
}

func (m ${name}) MarshalJSON() ([]byte, error) {
  type plain ${name}
  extra := m.${extra}
  m.${extra} = nil // its tag, "-,omitempty", would write it under the key "-"
  known, err := json.Marshal(plain(m))
  if err != nil || len(extra) == 0 {
    return known, err
  }
  var all map[string]interface{}
  if err := json.Unmarshal(known, &all); err != nil {
    return nil, err
  }
  for key, value := range extra {
    if _, taken := all[key]; !taken {
      all[key] = value
    }
  }
  return json.Marshal(all)
}`;
    },
  },
};
const golang = new GoFileGenerator({
  presets: [
    { preset: GO_COMMON_PRESET, options: { addJsonTag: true } },
    GO_UNION_TAG,
    GO_ADDITIONAL_PROPERTIES,
  ],
});
const go = await golang.generateToFiles(document, `${out}/go`, { packageName: "lobby" });
console.log(JSON.stringify({ ts: ts.map((m) => m.modelName), python: py.length, go: go.length }));
