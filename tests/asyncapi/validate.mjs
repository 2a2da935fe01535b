// Parse AsyncAPI documents with the official parser (@asyncapi/parser) and report what it says.
//
//   node tests/asyncapi/validate.mjs protocol/asyncapi.json [MORE.json ...]
//
// Prints one JSON line per file: {"path", "valid", "errors": [{code, message, path}],
// "warnings", "messages", "operations"}. A file is valid when the parser reports no error
// (warnings and hints are counted, not fatal). Exits 0 when every file is valid, else 1.
// One process checks them all: loading the parser's rulesets takes seconds.
import { readFile } from "node:fs/promises";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";

const paths = process.argv.slice(2);
if (paths.length === 0) {
  console.error("usage: node validate.mjs ASYNCAPI_FILE [...]");
  process.exit(2);
}
const parser = new Parser();
let allValid = true;
for (const path of paths) {
  const text = await readFile(path, "utf8");
  const { document, diagnostics } = await parser.parse(text, { source: path });
  const errors = diagnostics
    .filter((d) => d.severity === DiagnosticSeverity.Error)
    .map((d) => ({ code: d.code, message: d.message, path: d.path.join("/") }));
  const warnings = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Warning);
  for (const w of warnings) console.error(`${path}: ${w.code}: ${w.message} at ${w.path.join("/")}`);
  const valid = errors.length === 0 && document !== undefined;
  allValid &&= valid;
  console.log(
    JSON.stringify({
      path,
      valid,
      errors,
      warnings: warnings.length,
      messages: document ? document.allMessages().length : 0,
      operations: document ? document.operations().length : 0,
    }),
  );
}
process.exit(allValid ? 0 : 1);
