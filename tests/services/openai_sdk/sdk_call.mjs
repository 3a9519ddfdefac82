// One call through the official OpenAI SDK, for tests/services/test_openai.py.
// argv[2]: the SDK install (scripts/install-openai-sdk.sh); stdin: a JSON spec
//   {"baseURL", "apiKey", "api": "completions" | "chat", "params": {...}}
// stdout: one JSON object: {"result": <the SDK's reply>} or, for a stream,
// {"chunks": [...]} in arrival order; a failure is
// {"error": {"class", "status", "type", "param", "code", "message"}}.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.argv[2], "node_modules", "x.js"));
const OpenAI = require("openai");
const spec = JSON.parse(fs.readFileSync(0, "utf8"));
const client = new OpenAI({ baseURL: spec.baseURL, apiKey: spec.apiKey ?? "none", maxRetries: 0, timeout: 60000 });
const api = spec.api === "chat" ? client.chat.completions : client.completions;
try {
  const reply = await api.create(spec.params);
  if (spec.params.stream) {
    const chunks = [];
    for await (const chunk of reply) chunks.push(chunk);
    console.log(JSON.stringify({ chunks }));
  } else {
    console.log(JSON.stringify({ result: reply }));
  }
} catch (e) {
  console.log(JSON.stringify({
    error: { class: e.constructor.name, status: e.status ?? null, type: e.type ?? null, param: e.param ?? null,
             code: e.code ?? null, message: e.message },
  }));
}
