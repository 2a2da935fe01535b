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
const golang = new GoFileGenerator({
  presets: [{ preset: GO_COMMON_PRESET, options: { addJsonTag: true } }],
});
const go = await golang.generateToFiles(document, `${out}/go`, { packageName: "lobby" });
console.log(JSON.stringify({ ts: ts.map((m) => m.modelName), python: py.length, go: go.length }));
