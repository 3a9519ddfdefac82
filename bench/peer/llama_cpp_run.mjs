// The llama.cpp side of bench/peer/peer_bench.py: runs token-id prompts
// through llama.cpp's prebuilt CPU library (node-llama-cpp, installed by
// scripts/install-llama-cpp-peer.sh) and prints one JSON object on stdout.
//
//   node llama_cpp_run.mjs --peer DIR --check
//       loads the prebuilt binary (no GPU, no build, no download): {"loaded":true,...}
//   node llama_cpp_run.mjs --peer DIR --model M.gguf --threads 2 --job JOB.json
//       JOB.json: {"runs": [{"name", "prompts": [[ids]], "max_new_tokens", "repeats"}]}
//       out: {"runs": [{"name", "repeats": [{"wall_s", "requests": [{"tokens", "times_s"}]}]}]}
//
// Each repeat of a run gets a fresh context with one sequence per prompt, all
// started at once (llama.cpp batches their steps together), decoding greedily
// (temperature 0) for exactly max_new_tokens (EOS ignored). times_s[k] is when
// token k of a request arrived, in seconds from the repeat's start, so TTFT is
// times_s[0] and a batch-1 decode step is the mean gap after it. The model
// loads once per job and is not timed.
import path from "node:path";
import fs from "node:fs";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a}`);
    const key = a.slice(2);
    if (key === "check") out.check = true;
    else out[key] = argv[++i];
  }
  return out;
}

// Nothing is fetched or compiled at run time: only the prebuilt CPU binary.
process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
process.env.NODE_LLAMA_CPP_GPU = "false";

const args = parseArgs(process.argv.slice(2));
if (!args.peer) throw new Error("--peer DIR (the install of scripts/install-llama-cpp-peer.sh) is required");
const entry = path.join(args.peer, "node_modules", "node-llama-cpp", "dist", "index.js");
if (!fs.existsSync(entry)) throw new Error(`no node-llama-cpp in ${args.peer}: run scripts/install-llama-cpp-peer.sh`);
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);
const threads = Number(args.threads || 2);

const llama = await getLlama({
  gpu: false,
  build: "never",
  skipDownload: true,
  usePrebuiltBinaries: true,
  progressLogs: false,
  maxThreads: threads,
  logLevel: LlamaLogLevel.error,
});

const info = {
  loaded: true,
  build_type: llama.buildType,
  gpu: llama.gpu,
  llama_cpp_release: llama.llamaCppRelease,
  system_info: llama.systemInfo,
  threads,
};
if (llama.buildType !== "prebuilt") throw new Error(`expected the prebuilt binary, got ${llama.buildType}`);
if (args.check) {
  console.log(JSON.stringify(info));
  await llama.dispose();
  process.exit(0);
}

if (!args.model || !args.job) throw new Error("--model GGUF and --job JSON are required (or --check)");
const job = JSON.parse(fs.readFileSync(args.job, "utf8"));
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0, useMmap: true });

async function runOnce(run) {
  const longest = Math.max(...run.prompts.map((p) => p.length));
  const context = await model.createContext({
    sequences: run.prompts.length,
    contextSize: longest + run.max_new_tokens + 16,
    threads: { ideal: threads, min: threads },
    ...(run.batch_size ? { batchSize: run.batch_size } : {}),
  });
  const sequences = run.prompts.map(() => context.getSequence());
  const start = process.hrtime.bigint();
  const seconds = () => Number(process.hrtime.bigint() - start) / 1e9;
  const requests = await Promise.all(run.prompts.map(async (prompt, i) => {
    const tokens = [], times = [];
    if (run.max_new_tokens > 0) {
      for await (const token of sequences[i].evaluate(prompt, { temperature: 0 })) {
        tokens.push(token);
        times.push(seconds());
        if (tokens.length >= run.max_new_tokens) break;
      }
    }
    return { tokens, times_s: times };
  }));
  const wall = seconds();
  await context.dispose();
  return { wall_s: wall, requests };
}

const runs = [];
for (const run of job.runs) {
  const repeats = [];
  for (let r = 0; r < (run.repeats || 1); ++r) repeats.push(await runOnce(run));
  runs.push({ name: run.name, repeats });
  process.stderr.write(`llama.cpp: ${run.name} done (${repeats.length} repeats)\n`);
}
console.log(JSON.stringify({ ...info, model: args.model, runs }));
await model.dispose();
await llama.dispose();
