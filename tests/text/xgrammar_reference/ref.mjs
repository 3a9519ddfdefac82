#!/usr/bin/env node
// XGrammar (the grammar engine of vLLM and SGLang), through its WebAssembly
// build @mlc-ai/web-xgrammar, as the reference side of chunkattn's
// differential grammar test (tests/text/test_xgrammar_differential.py). It
// speaks the protocol of build/bin/chunkattn-grammar-check (its file comment
// is the full description): JSON lines in, one JSON line out per line, each
// flushed, so a test may drive both line by line.
//
//   in:  {"kind": "json_schema" | "regex" | "ebnf" | "json_object" | "choice",
//         "grammar": ..., "strings": ["text" | {"hex": "..."}, ...],
//         "whitespace": "flexible", "max_whitespace": 16, "strict": true,
//         "sample": 0, "seed": 0, "max_len": 256, "avoid": [13]}
//   out: {"results": [{"prefix", "complete", "accepted_bytes"}, ...],
//         "samples": ["text" | {"hex": "..."}, ...], "samples_unfinished": n,
//         "compile_ms": x}  or  {"error": "..."}
//
//   node ref.mjs [--reference DIR] < requests.jsonl > answers.jsonl
//
// --reference: the folder scripts/install-xgrammar-reference.sh printed.
//   Default: $CHUNKATTN_XGRAMMAR_REFERENCE, else this folder when it has
//   node_modules, else the install script's default folder for this lock.
//
// How each kind reaches XGrammar (0.1.27):
//   json_schema  compileJSONSchema(schema, any_whitespace=true, indent=None,
//                separators=None, strict_mode=strict,
//                max_whitespace_cnt=max_whitespace): runs of [ \n\t] wherever
//                JSON allows whitespace, none at the top level: the layout of
//                chunkattn's JsonWhitespace::kFlexible ("compact" has no
//                XGrammar equivalent and is refused); max_whitespace 0 is
//                any_whitespace=false with separators "," and ":"
//   json_object  compileBuiltinJSONGrammar() (an object or an array, with
//                unbounded whitespace: the test accounts for both)
//   ebnf         compileGrammar(text, "root"): XGrammar's GBNF dialect
//   regex        compileStructuralTag({format: {type: "regex", pattern}}):
//                the web binding's only way to its regex converter; the
//                output must match the whole pattern
//   choice       an EBNF alternation of the strings as literals
//
// The vocabulary is 257 tokens: "<0x00>".."<0xFF>" with vocab type
// byte_fallback, so token b is the single byte b (UTF-8 or not), and "</s>"
// (256), the only stop token. prefix: acceptToken took every byte;
// complete: also acceptToken(</s>) and then isTerminated().
//
// Samples: a random walk over getNextTokenBitmask(), bytes weighted like
// chunkattn-grammar-check's (printable ASCII 70, other ASCII 15, non-ASCII
// 15; a byte in "avoid" only when no other may follow); where </s> is
// allowed the walk stops with probability 1/4. XGrammar
// has no shortest completion, so past max_len bytes a depth-first search
// (closing bytes first, rollBack on dead ends) looks for an end within 64
// more bytes and 500 masks, then up to 2 random walks of 512 bytes that end
// at the first chance; a sample that finds no end is dropped and counted in
// samples_unfinished, and so is every sample left when the request has spent
// 15 s sampling (a very ambiguous grammar makes each mask cost milliseconds;
// only then do the samples depend on the machine's speed).
//
// Loading: the package says "type": "module" but ships a CommonJS bundle
// (require, __filename), which `import` cannot load, so the bundle is
// evaluated here as CommonJS; its wasm is inlined as a data URI. Node exits
// with status 0 while the wasm instantiation promise is pending unless
// something keeps the event loop alive: a long timer does. A grammar that
// XGrammar rejects prints "[FATAL] file:line: message" and aborts the wasm
// instance; the message becomes the answer's error and a fresh instance is
// made for the next request.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PACKAGE = "@mlc-ai/web-xgrammar";
const STOP = 256;
const MAX_CACHED = 32;          // compiled grammars kept (a test asks twice for each of a batch)
const FINISH_DEPTH = 64;        // bytes a finishing search may add
const FINISH_STEPS = 500;       // masks it may look at
const FINISH_WALKS = 2;         // then random walks that end at the first chance
const FINISH_WALK_LEN = 512;    // bytes each
// A request's samples stop after this long: a very ambiguous grammar (say
// (a|[^b]*)* ) makes each of XGrammar's masks cost milliseconds.
const SAMPLE_BUDGET_MS = 15000;

function fail(message) {
  process.stderr.write(`ref.mjs: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = { reference: null };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--reference") {
      if (i + 1 >= argv.length) fail("--reference needs a value");
      args.reference = argv[++i];
    } else if (a === "-h" || a === "--help") {
      process.stdout.write("usage: node ref.mjs [--reference DIR] < requests.jsonl > answers.jsonl\n");
      process.exit(0);
    } else fail(`unknown argument ${a}`);
  }
  return args;
}

const hasLibrary = (dir) => fs.existsSync(path.join(dir, "node_modules", PACKAGE, "package.json"));

// Same key as scripts/npm-ci-cached.sh: SHA-256 of package.json then
// package-lock.json, first 16 hex digits.
function defaultReferenceDir() {
  const hash = crypto.createHash("sha256");
  for (const f of ["package.json", "package-lock.json"]) hash.update(fs.readFileSync(path.join(HERE, f)));
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache");
  return path.join(cache, "chunkattn", "xgrammar-reference", hash.digest("hex").slice(0, 16));
}

function findReference(explicit) {
  const candidates = explicit
    ? [explicit]
    : process.env.CHUNKATTN_XGRAMMAR_REFERENCE
      ? [process.env.CHUNKATTN_XGRAMMAR_REFERENCE]
      : [HERE, defaultReferenceDir()];
  for (const dir of candidates) if (hasLibrary(dir)) return path.resolve(dir);
  fail(`no ${PACKAGE} under ${candidates.join(" or ")}: run scripts/install-xgrammar-reference.sh ` +
       "and pass the folder it prints with --reference");
}

const REFERENCE = findReference(parseArgs(process.argv.slice(2)).reference);
const BUNDLE = createRequire(path.join(REFERENCE, "package.json")).resolve(PACKAGE);
const BUNDLE_SOURCE = fs.readFileSync(BUNDLE, "utf8");
// The verdicts the test declares (its DECLARED and KNOWN) are this version's.
const VERSION = JSON.parse(fs.readFileSync(path.join(REFERENCE, "node_modules", PACKAGE, "package.json"), "utf8"))
  .version;
const PINNED = JSON.parse(fs.readFileSync(path.join(HERE, "package.json"), "utf8")).dependencies[PACKAGE];
if (VERSION !== PINNED) fail(`${REFERENCE} has ${PACKAGE} ${VERSION}, not the pinned ${PINNED}`);

function loadBundle() {
  const module = { exports: {} };
  new Function("exports", "module", "require", "__filename", "__dirname", BUNDLE_SOURCE)(
    module.exports, module, createRequire(BUNDLE), BUNDLE, path.dirname(BUNDLE));
  return module.exports;
}

const keepAlive = setInterval(() => {}, 1 << 30);

// XGrammar's C++ errors reach console.error as "[FATAL] file:line: message"
// before the abort; keep the last one as the error text.
// Everything else the module prints (emscripten's "Aborted()" goes to
// console.log) stays off stdout, which carries the answers only.
let lastFatal = null;
const consoleError = console.error.bind(console);
console.error = (...args) => {
  const message = args.join(" ");
  if (message.includes("[FATAL]")) lastFatal = message.replace(/^.*?\[FATAL\]\s*\S+:\d+:\s*/, "");
  else if (process.env.CHUNKATTN_XGRAMMAR_DEBUG) consoleError(...args);
};
console.log = console.warn = console.info = console.debug = (...args) => {
  if (process.env.CHUNKATTN_XGRAMMAR_DEBUG) consoleError(...args);
};

const VOCAB = [];
for (let b = 0; b < 256; ++b) VOCAB.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
VOCAB.push("</s>");

let xg = null;
let compiler = null;
const cache = new Map();  // request key -> {compiled, matcher}, oldest first

async function init() {
  for (const { compiled, matcher } of cache.values()) {
    try { matcher.dispose(); compiled.dispose(); } catch { /* the aborted instance's handles */ }
  }
  cache.clear();
  xg = loadBundle();
  const info = await xg.TokenizerInfo.createTokenizerInfo(VOCAB, "byte_fallback", false, VOCAB.length, [STOP]);
  compiler = await xg.GrammarCompiler.createGrammarCompiler(info, true);
}

function errorText(e) {
  if (e instanceof Error) return e.message;
  if (typeof e === "number") return `wasm exception (pointer ${e})`;
  return String(e);
}

// An EBNF string literal for `s` (a choice).
function ebnfLiteral(s) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (cp < 0x20 || cp === 0x7f) out += "\\x" + cp.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + '"';
}

function requestError(message) {
  const e = new Error(message);
  e.badRequest = true;
  return e;
}

async function compile(req) {
  const kind = req.kind;
  if (kind === "json_schema" || kind === "json_object") {
    if ((req.whitespace ?? "flexible") !== "flexible") {
      throw requestError("XGrammar has no equivalent of whitespace \"compact\" (one optional space after , and :)");
    }
  }
  if (kind === "json_schema") {
    const schema = typeof req.grammar === "string" ? req.grammar : JSON.stringify(req.grammar);
    // XGrammar refuses max_whitespace_cnt 0; no whitespace at all is its
    // any_whitespace=false with separators "," and ":".
    const maxWhitespace = req.max_whitespace ?? 16;
    if (maxWhitespace === 0) return compiler.compileJSONSchema(schema, false, -1, [",", ":"], req.strict ?? true);
    return compiler.compileJSONSchema(schema, true, -1, undefined, req.strict ?? true, maxWhitespace);
  }
  if (kind === "json_object") return compiler.compileBuiltinJSONGrammar();
  if (kind === "ebnf") {
    if (typeof req.grammar !== "string") throw requestError('"grammar" must be a string');
    return compiler.compileGrammar(req.grammar, "root");
  }
  if (kind === "regex") {
    if (typeof req.grammar !== "string") throw requestError('"grammar" must be a string');
    return compiler.compileStructuralTag({ type: "structural_tag", format: { type: "regex", pattern: req.grammar } });
  }
  if (kind === "choice") {
    if (!Array.isArray(req.grammar) || req.grammar.length === 0 || req.grammar.some((s) => typeof s !== "string")) {
      throw requestError('choice: "grammar" must be a non-empty array of strings');
    }
    return compiler.compileGrammar("root ::= " + req.grammar.map(ebnfLiteral).join(" | "), "root");
  }
  throw requestError(`unknown kind ${JSON.stringify(kind)}`);
}

async function getMatcher(req) {
  const key = JSON.stringify([req.kind, req.grammar ?? null, req.whitespace ?? "flexible",
                              req.max_whitespace ?? 16, req.strict ?? true]);
  const hit = cache.get(key);
  if (hit) {
    cache.delete(key);
    cache.set(key, hit);
    return hit;
  }
  const compiled = await compile(req);
  const matcher = await xg.GrammarMatcher.createGrammarMatcher(compiled, [STOP], false);
  const entry = { compiled, matcher };
  cache.set(key, entry);
  while (cache.size > MAX_CACHED) {
    const [oldest, old] = cache.entries().next().value;
    cache.delete(oldest);
    old.matcher.dispose();
    old.compiled.dispose();
  }
  return entry;
}

function decodeString(entry) {
  if (typeof entry === "string") return Buffer.from(entry, "utf8");
  if (entry && typeof entry.hex === "string" && /^([0-9a-fA-F]{2})*$/.test(entry.hex)) {
    return Buffer.from(entry.hex, "hex");
  }
  throw requestError('a string must be text or {"hex": "..."}');
}

function encodeString(bytes) {
  const buf = Buffer.from(bytes);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(buf);
  } catch {
    return { hex: buf.toString("hex") };
  }
}

function verdict(matcher, bytes) {
  matcher.reset();
  let n = 0;
  while (n < bytes.length && matcher.acceptToken(bytes[n])) ++n;
  const prefix = n === bytes.length;
  const complete = prefix && matcher.acceptToken(STOP) && matcher.isTerminated();
  return { prefix, complete, accepted_bytes: n };
}

// Seeded uniform [0, 1) (mulberry32).
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function allowedBytes(matcher) {
  const mask = await matcher.getNextTokenBitmask();
  const bit = (t) => ((mask[t >> 5] >>> (t & 31)) & 1) === 1;
  const bytes = [];
  for (let b = 0; b < 256; ++b) if (bit(b)) bytes.push(b);
  return { bytes, stop: bit(STOP) };
}

// Bytes that tend to end a JSON value or a repetition, tried first.
const CLOSERS = [0x22, 0x7d, 0x5d, 0x30, 0x31, 0x61, 0x2c, 0x3a];
const LAST = new Set([0x20, 0x09, 0x0a, 0x0d, 0x5b, 0x7b]);  // whitespace and openers: last
function finishOrder(bytes) {
  const set = new Set(bytes);
  const first = CLOSERS.filter((b) => set.has(b));
  const rest = bytes.filter((b) => !CLOSERS.includes(b) && !LAST.has(b));
  const last = bytes.filter((b) => LAST.has(b));
  return [...first, ...rest, ...last];
}

// Bytes that end the match from here (depth first, rolling back), or null.
async function finish(matcher, depth, budget) {
  if (budget.steps-- <= 0 || performance.now() > budget.deadline) return null;
  const { bytes, stop } = await allowedBytes(matcher);
  if (stop) return [];
  if (depth === 0) return null;
  for (const b of finishOrder(bytes)) {
    if (!matcher.acceptToken(b)) continue;
    const rest = await finish(matcher, depth - 1, budget);
    if (rest !== null) return [b, ...rest];
    matcher.rollBack(1);
    if (budget.steps <= 0) return null;
  }
  return null;
}

// A random byte of `bytes`, weighted by group (see the file comment); one
// of `avoid` only when there is no other.
function pick(bytes, rand, avoid) {
  const groups = [[], [], []];
  const avoided = [];
  for (const b of bytes) {
    if (avoid.has(b)) avoided.push(b);
    else groups[b >= 0x80 ? 2 : b >= 0x20 && b < 0x7f ? 0 : 1].push(b);
  }
  if (avoided.length === bytes.length) groups[1] = avoided;
  const weights = groups.map((g, i) => (g.length === 0 ? 0 : [0.7, 0.15, 0.15][i]));
  let r = rand() * (weights[0] + weights[1] + weights[2]);
  let g = 0;
  while (g < 2 && (weights[g] === 0 || r >= weights[g])) {
    r -= weights[g];
    ++g;
  }
  return groups[g][Math.floor(rand() * groups[g].length)];
}

function accept(matcher, b, at) {
  if (!matcher.acceptToken(b)) {
    throw new Error(`sampling: the mask allows byte ${b} after ${at} bytes but acceptToken refuses it`);
  }
}

// One accepted string, or null when no end was found in budget or the
// request's time ran out (performance.now() past `deadline`).
async function sample(matcher, rand, maxLen, avoid, deadline) {
  matcher.reset();
  const out = [];
  while (true) {
    if (performance.now() > deadline) return null;
    const { bytes, stop } = await allowedBytes(matcher);
    if (stop && (bytes.length === 0 || rand() < 0.25)) return out;
    if (out.length >= maxLen) break;
    if (bytes.length === 0) return null;  // a dead end XGrammar let the walk into
    const b = pick(bytes, rand, avoid);
    accept(matcher, b, out.length);
    out.push(b);
  }
  const rest = await finish(matcher, FINISH_DEPTH, { steps: FINISH_STEPS, deadline });
  if (rest !== null) return out.concat(rest);
  // The search found no end (say, an end needs one rare byte after a loop
  // the search went round first): walk on at random, ending at the first
  // chance, a few times.
  for (let attempt = 0; attempt < FINISH_WALKS; ++attempt) {
    const more = [];
    while (more.length < FINISH_WALK_LEN) {
      if (performance.now() > deadline) return null;
      const { bytes, stop } = await allowedBytes(matcher);
      if (stop) return out.concat(more);
      if (bytes.length === 0) break;
      const b = pick(bytes, rand, avoid);
      accept(matcher, b, out.length + more.length);
      more.push(b);
    }
    if (more.length > 0) matcher.rollBack(more.length);
  }
  return null;
}

function intField(req, key, dflt, hi) {
  const v = req[key] ?? dflt;
  if (!Number.isInteger(v) || v < 0 || v > hi) throw requestError(`"${key}" must be an integer in [0, ${hi}]`);
  return v;
}

async function handle(line) {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return { error: "bad request: not JSON" };
  }
  if (!req || typeof req !== "object" || Array.isArray(req)) return { error: "bad request: not a JSON object" };
  let strings, count, seed, maxLen, avoid;
  try {
    strings = (req.strings ?? []).map(decodeString);
    count = intField(req, "sample", 0, 100000);
    seed = intField(req, "seed", 0, Number.MAX_SAFE_INTEGER);
    maxLen = intField(req, "max_len", 256, 1 << 20);
    intField(req, "max_whitespace", 16, 1000);
    avoid = new Set(req.avoid ?? []);
    if (!Array.isArray(req.avoid ?? []) || [...avoid].some((b) => !Number.isInteger(b) || b < 0 || b > 255)) {
      throw requestError('"avoid" must be an array of bytes');
    }
  } catch (e) {
    return { error: `bad request: ${errorText(e)}` };
  }
  const t0 = performance.now();
  lastFatal = null;
  let entry;
  try {
    entry = await getMatcher(req);
  } catch (e) {
    if (e && e.badRequest) return { error: `bad request: ${e.message}` };
    const message = lastFatal ?? errorText(e);
    await init();
    return { error: message };
  }
  const compileMs = performance.now() - t0;
  const results = strings.map((bytes) => verdict(entry.matcher, bytes));
  const samples = [];
  let unfinished = 0;
  const deadline = performance.now() + SAMPLE_BUDGET_MS;
  for (let i = 0; i < count; ++i) {
    // A stream per sample: a sample's bytes do not depend on the ones before it.
    const s = await sample(entry.matcher, random(seed * 1000003 + i), maxLen, avoid, deadline);
    if (s === null) ++unfinished;
    else samples.push(encodeString(s));
  }
  return { results, samples, samples_unfinished: unfinished, compile_ms: +compileMs.toFixed(3) };
}

await init();
if (process.env.CHUNKATTN_XGRAMMAR_DEBUG) process.stderr.write(`ref.mjs: ${PACKAGE} ${VERSION} from ${REFERENCE}\n`);
const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line.trim()) continue;
  let out;
  try {
    out = await handle(line);
  } catch (e) {
    out = { error: `internal: ${errorText(e)}` };
    await init();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
clearInterval(keepAlive);
