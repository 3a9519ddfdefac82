#!/usr/bin/python3
"""Writes a seeded corpus of conversations for the differential chat-template
test (test_chat_templates.py).

Each line is one call of transformers' apply_chat_template, as
chat_reference.py and chunkattn-chat-render read it:
  {"messages": [...], "tools": [...] (sometimes), "add_generation_prompt": bool,
   "kwargs": {...} (sometimes)}
Everything in it is what a user could pass to apply_chat_template: a
non-empty list of message dicts, each with a "role" string; "content" a
string, null, missing (an assistant turn that only calls tools) or, for
templates that take them, a list of parts ({"type": "text", "text": ...},
{"type": "image"}); OpenAI-style "tool_calls" ({"type": "function",
"function": {"name", "arguments"}}, arguments a dict or a JSON string) and
"tool" messages (tool_call_id, name); Qwen 3's "reasoning_content"; tool
definitions as OpenAI function schemas; kwargs such as enable_thinking, and
now and then a special token (bos_token) overridden by a kwarg.

The conversations aim at the branches of the five templates under test
(Llama 3 and 3.1, Qwen 3, Gemma 3, DeepSeek V3): with and without a system
message, 1-8 turns, tool definitions, one or several tool calls with and
without content, runs of tool results, user turns that are wrapped tool
responses (Qwen 3's multi-step logic), reasoning as a field and inside
<think>...</think>, the generation prompt on and off. The text inside is
hostile: empty strings, Unicode (CJK, right-to-left, combining marks, emoji
sequences), every kind of whitespace at either end (Python's str.strip,
behind the `trim` filter, strips some and not others), control characters,
quotes and backslashes, Jinja-looking text ({{ x }}, {% if %}), and the
templates' own special tokens. About one line in eight is deliberately
malformed (roles out of order, an unknown role, system not first, content of
the wrong type for the template) so that templates that raise_exception do,
and the other failure paths are taken.

--family picks the weights for one template (e.g. list-of-parts content only
where the template reads it: elsewhere Python would print the list's repr);
the default, "generic", mixes all of them.

Deterministic: the same --seed, --count and --family give the same bytes.
Standard library only; run it with /usr/bin/python3.

Usage:
  make_chat_corpus.py --seed N --count N [--family NAME] [--out FILE]
"""

import argparse
import json
import random
import sys

FAMILIES = ("generic", "llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3")

# Each template's own control tokens, to be written into message text.
SPECIAL_TOKENS = {
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
               "<|end_of_text|>", "<|python_tag|>", "<|eom_id|>"],
    "qwen3": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
              "<think>", "</think>", "<tool_response>", "</tool_response>", "<tools>"],
    "gemma3": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
               "<end_of_image>", "<pad>"],
    "deepseek_v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                    "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁end｜>"],
}
SPECIAL_TOKENS["llama3_1"] = SPECIAL_TOKENS["llama3"]
SPECIAL_TOKENS["generic"] = sorted({t for ts in SPECIAL_TOKENS.values() for t in ts})

# Per family: how often each shape appears (probabilities).
#   parts:        a message's content is a list of parts (only Gemma 3 reads
#                 them; Qwen 3 and DeepSeek fail on them, worth a few lines;
#                 Llama 3 would print the list's Python repr, so never there)
#   calls:        an assistant turn calls tools, when tools are defined (Gemma
#                 3's template has no tool turns: they break its alternation)
#   args_string:  tool-call arguments are a JSON string rather than a dict
#                 (DeepSeek concatenates them, so a dict is a type error there)
#   call_content: an assistant turn with tool_calls carries text, "", null or
#                 no content key (Qwen 3 fails on null and a missing key)
#   thinking:     reasoning in the assistant turns, and enable_thinking
WEIGHTS = {
    "generic": dict(parts=0.05, calls=0.5, args_string=0.5, call_content=(0.3, 0.35, 0.25, 0.1),
                    thinking=0.3),
    "llama3": dict(parts=0.0, calls=0.6, args_string=0.5, call_content=(0.3, 0.3, 0.3, 0.1), thinking=0.15),
    "llama3_1": dict(parts=0.0, calls=0.6, args_string=0.5, call_content=(0.3, 0.3, 0.3, 0.1), thinking=0.15),
    "qwen3": dict(parts=0.002, calls=0.6, args_string=0.5, call_content=(0.45, 0.52, 0.02, 0.01),
                  thinking=0.6),
    "gemma3": dict(parts=0.3, calls=0.03, args_string=0.5, call_content=(0.5, 0.3, 0.15, 0.05), thinking=0.1),
    "deepseek_v3": dict(parts=0.002, calls=0.6, args_string=0.97, call_content=(0.2, 0.1, 0.68, 0.02),
                        thinking=0.15),
}

WORDS = ("the of and to in is that for it as with was on be at by this have from or one had word but "
         "not what all were when your can said there use each which their time will way about many then "
         "them would write like so these her long make thing see him two has look more day could go come "
         "number sound most people over know water than call first who may down side been now find any "
         "new work part take get place made live where after back little only round man year came show "
         "every good me give our under weather city price cache prefix token chunk kernel server").split()

PHRASES = [
    "今天天气很好，我们去公园散步吧。", "東京駅から新幹線に乗りました。", "안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم، كيف حالك؟", "שָׁלוֹם עולם", "नमस्ते दुनिया", "ภาษาไทยไม่มีการเว้นวรรค",
    "Съешь же ещё этих мягких французских булок.", "Γειά σου Κόσμε", "Zażółć gęślą jaźń",
    "café naïve résumé", "e\u0301 a\u0308 o\u0303", "Größe Straße", "İstanbul ılık",
    "\U0001F600\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
    "\U0001F1EF\U0001F1F5 \U0001F3F3\ufe0f\u200d\U0001F308", "1\ufe0f\u20e3 #\ufe0f\u20e3",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "ﬁ ﬂ Ⅻ ①", "\u202eright-to-left override\u202c",
]

# Whitespace Python's str.strip() (the `trim` filter) removes, and look-alikes
# it keeps (ZERO WIDTH SPACE, BOM, MONGOLIAN VOWEL SEPARATOR, WORD JOINER).
STRIPPED = [" ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
            "\xa0", "\u1680", "\u2000", "\u2003", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
            "\u3000"]
KEPT = ["\u200b", "\ufeff", "\u180e", "\u2060", "\u200d"]
CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x1b[31m", "\x7f", "\u0080", "\u009f"]

JINJA_LOOKING = ["{{ x }}", "{{ messages }}", "{% if true %}yes{% endif %}", "{%- for m in messages -%}",
                 "{# a comment #}", "{{ raise_exception('boom') }}", "{% raw %}{{ }}{% endraw %}",
                 "{{", "}}", "{%", "%}", "{#", "#}", "{{- bos_token -}}", "{% set x = 1 %}",
                 "{{ '\\n' }}", "${HOME}", "%s %d %%", "{0} {name}"]

CODE = [
    'def add(a, b):\n    """Adds."""\n    return a + b\n',
    "for (int i = 0; i < n; ++i) {\n\tsum += v[i];\n}\n",
    '```json\n{"key": "value", "list": [1, 2.5, null, true]}\n```',
    "SELECT name, COUNT(*) FROM users WHERE id > 10 GROUP BY 1;",
    "<div class=\"x\">&amp; &lt;tag&gt; 'single' \"double\"</div>",
    "path\\to\\file C:\\\\Windows \\n is not a newline \\u00e9",
]

TOOL_NAMES = ["get_weather", "search_web", "run_sql", "send_email", "calculate", "lookup_stock",
              "translate_text", "create_event", "read_file", "convert_units"]

ROLES_UNKNOWN = ["developer", "narrator", "function", "ipython", "observation", "Human", "USER", ""]


class ChatCorpus:
    """Generators for conversations; all randomness comes from self.rng."""

    def __init__(self, rng, family):
        self.rng = rng
        self.family = family
        self.weights = WEIGHTS[family]
        self.tokens = SPECIAL_TOKENS[family]

    def chance(self, p):
        return self.rng.random() < p

    def pick(self, seq):
        return self.rng.choice(seq)

    # -- text ------------------------------------------------------------------
    def words(self, lo, hi):
        return " ".join(self.pick(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def sentence(self):
        s = self.words(3, 14)
        return s[:1].upper() + s[1:] + self.pick([".", "?", "!", "...", ":", ""])

    def paragraph(self):
        return " ".join(self.sentence() for _ in range(self.rng.randint(1, 5)))

    def text(self, allow_empty=True):
        """A message body: mostly prose, often hostile."""
        r = self.rng.random()
        if allow_empty and r < 0.04:
            return self.pick(["", " ", "\n", "\n\n", "\t"])
        if r < 0.40:
            body = self.paragraph()
        elif r < 0.50:
            body = "\n\n".join(self.paragraph() for _ in range(self.rng.randint(2, 4)))
        elif r < 0.60:
            body = self.sentence() + " " + self.pick(PHRASES) + " " + self.pick(PHRASES)
        elif r < 0.67:
            body = self.sentence() + "\n" + self.pick(CODE)
        elif r < 0.74:
            body = self.sentence() + " " + self.pick(JINJA_LOOKING) + " " + self.words(1, 4)
        elif r < 0.82:
            t = self.pick(self.tokens)
            body = self.pick([t, t + self.sentence(), self.sentence() + t, self.words(1, 3) + t + self.words(1, 3),
                              t + "user\n" + self.sentence() + self.pick(self.tokens)])
        elif r < 0.87:
            body = self.words(1, 5) + self.pick(CONTROLS) + self.words(1, 3)
        elif r < 0.90:
            body = "\"quoted\" and 'single' and back\\slash and \\\" and \u2018curly\u2019 \u201cdouble\u201d"
        elif r < 0.92:
            body = "\n".join(self.paragraph() for _ in range(self.rng.randint(10, 30)))  # a few KB
        else:
            body = self.sentence() + self.pick(["\r\n", "\r", "\u2028", "\u0085"]) + self.sentence()
        # Whitespace at either end: what trim/strip removes and what it keeps.
        if self.chance(0.25):
            body = "".join(self.pick(STRIPPED + KEPT) for _ in range(self.rng.randint(1, 3))) + body
        if self.chance(0.25):
            body = body + "".join(self.pick(STRIPPED + KEPT) for _ in range(self.rng.randint(1, 3)))
        return body

    def parts(self):
        """Content as a list of parts, as multimodal chat APIs send it."""
        out = []
        for _ in range(self.rng.randint(1, 3)):
            if self.chance(0.15):
                out.append({"type": "image"})
            else:
                out.append({"type": "text", "text": self.text()})
        return out

    def content(self):
        if self.chance(self.weights["parts"]):
            return self.parts()
        return self.text()

    # -- values for tool arguments and schemas -----------------------------------
    def number(self):
        r = self.rng.randrange(8)
        if r < 3:
            return self.rng.randint(-1000, 100000)
        if r == 3:
            return self.pick([0, 1, -1, 2 ** 31, 2 ** 53 - 1, -(2 ** 53) + 1])
        if r < 6:
            return round(self.rng.uniform(-1000, 1000), self.rng.randint(0, 4))
        # Floats whose Python repr takes an exponent or a trailing ".0".
        return self.pick([1e-05, 1.5e-07, 1e16, 2.5e+20, 100.0, -0.0, 0.1, 1 / 3, 123456789.125])

    def value(self, depth=0):
        r = self.rng.randrange(9 if depth < 2 else 5)
        if r == 0:
            return self.number()
        if r == 1:
            return self.pick([True, False, None])
        if r in (2, 3, 4):
            return self.pick([self.words(1, 4), self.pick(PHRASES), self.pick(JINJA_LOOKING),
                              "line\nbreak\t\"quoted\"\\", "", self.pick(self.tokens)])
        if r in (5, 6):
            return [self.value(depth + 1) for _ in range(self.rng.randint(0, 4))]
        return {self.pick(WORDS) + str(i): self.value(depth + 1) for i in range(self.rng.randint(0, 4))}

    def arguments(self):
        args = {}
        for _ in range(self.rng.randint(0, 4)):
            args[self.pick(["city", "query", "unit", "limit", "sql", "to", "expression", "options",
                            "date", "text", "target_language", "path"])] = self.value()
        if self.chance(self.weights["args_string"]):
            # A JSON string as an OpenAI client sends it, in one of its spellings.
            style = self.rng.randrange(4)
            if style == 0:
                return json.dumps(args)
            if style == 1:
                return json.dumps(args, ensure_ascii=False)
            if style == 2:
                return json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            return json.dumps(args, indent=2, ensure_ascii=False)
        return args

    def schema(self, depth=0):
        """A JSON-schema property."""
        kind = self.rng.randrange(7 if depth < 2 else 4)
        desc = self.pick([self.sentence(), "The \"name\" of it.\nSecond line.", "Température en °C — « ok »",
                          "Use 'single' quotes\\backslashes", self.pick(PHRASES), ""])
        if kind == 0:
            prop = {"type": "string", "description": desc}
        elif kind == 1:
            prop = {"type": "string", "enum": [self.pick(WORDS) for _ in range(self.rng.randint(1, 4))],
                    "description": desc}
        elif kind == 2:
            prop = {"type": self.pick(["integer", "number"]), "description": desc}
            if self.chance(0.5):
                prop["minimum"] = self.pick([0, 1, -273.15])
                prop["maximum"] = self.pick([100, 1e6, 0.5])
        elif kind == 3:
            prop = {"type": "boolean", "description": desc, "default": self.pick([True, False, None])}
        elif kind == 4:
            prop = {"type": "array", "items": self.schema(depth + 1), "description": desc}
        elif kind == 5:
            prop = {"type": ["string", "null"], "description": desc}
        else:
            prop = self.object_schema(depth + 1)
            prop["description"] = desc
        return prop

    def object_schema(self, depth=0):
        names = sorted({self.pick(["city", "query", "unit", "limit", "options", "date", "items", "format",
                                   "recursive", "timezone"]) for _ in range(self.rng.randint(0, 4))})
        props = {name: self.schema(depth) for name in names}
        out = {"type": "object", "properties": props}
        if props and self.chance(0.7):
            out["required"] = [n for n in names if self.chance(0.6)]
        if self.chance(0.2):
            out["additionalProperties"] = False
        return out

    def tool(self, name):
        fn = {"name": name, "description": self.pick([self.sentence(), self.paragraph() + "\n\nExample: \"x\"",
                                                      self.pick(PHRASES), ""])}
        if self.chance(0.9):
            fn["parameters"] = self.object_schema()
        if self.chance(0.1):
            fn["return"] = {"type": "string", "description": self.sentence()}
        if self.chance(0.05):
            return fn  # a bare function schema: transformers passes any dict through
        return {"type": "function", "function": fn}

    # -- turns ---------------------------------------------------------------------
    def tool_call(self, names, i):
        call = {"type": "function", "function": {"name": self.pick(names), "arguments": self.arguments()}}
        if self.chance(0.6):
            call["id"] = "call_%d_%08x" % (i, self.rng.getrandbits(32))
        if self.chance(0.01):
            del call["type"]  # some clients leave it out
        return call

    def assistant_calls(self, names):
        calls = [self.tool_call(names, i) for i in range(self.pick([1, 1, 1, 2, 2, 3]))]
        message = {"role": "assistant", "tool_calls": calls}
        has_text, empty, null, missing = self.weights["call_content"]
        r = self.rng.random()
        if r < has_text:
            message["content"] = self.text(allow_empty=False)
        elif r < has_text + empty:
            message["content"] = ""
        elif r < has_text + empty + null:
            message["content"] = None
        # else: no content key at all
        if self.chance(self.weights["thinking"] / 2):
            message["reasoning_content"] = self.reasoning()
        # Python dicts (and the renderer's JSON objects) keep this key order.
        return dict(sorted(message.items(), key=lambda kv: ["role", "content", "reasoning_content",
                                                            "tool_calls"].index(kv[0])))

    def tool_results(self, calls):
        out = []
        for call in calls:
            message = {"role": "tool", "content": self.pick([
                json.dumps({"result": self.value(), "ok": True}, ensure_ascii=self.chance(0.5)),
                self.text(), str(self.number()), ""])}
            if "id" in call:
                message["tool_call_id"] = call["id"]
            if self.chance(0.7):
                message["name"] = call["function"]["name"]
            out.append(message)
        return out

    def reasoning(self):
        return self.pick([self.paragraph(), "\n" + self.paragraph() + "\n", "", "\n\n",
                          self.sentence() + "\n\n" + self.sentence(), None])

    def assistant_text(self):
        message = {"role": "assistant"}
        body = self.content()
        if isinstance(body, str) and self.chance(self.weights["thinking"]):
            r = self.rng.randrange(6)
            if r == 0:
                body = "<think>\n" + self.paragraph() + "\n</think>\n\n" + body
            elif r == 1:
                body = "<think>" + self.sentence() + "</think>" + body
            elif r == 2:
                body = self.paragraph() + "\n</think>\n\n" + body  # an unopened think
            elif r == 3:
                body = "<think>\n\n</think>\n\n" + body
            elif r == 4:
                message["reasoning_content"] = self.reasoning()
            else:
                message["reasoning_content"] = self.reasoning()
                body = "<think>\nignored when reasoning_content is set\n</think>\n\n" + body
        message["content"] = body
        return dict(sorted(message.items(), key=lambda kv: ["role", "content", "reasoning_content"].index(kv[0])))

    def user(self):
        message = {"role": "user", "content": self.content()}
        if self.chance(0.03):
            message["name"] = self.pick(["alice", "bob"])  # an extra key templates ignore
        return message

    def conversation(self):
        """A well-formed conversation, and the tools it may call."""
        tools = None
        names = TOOL_NAMES
        if self.chance(0.35):
            names = self.rng.sample(TOOL_NAMES, self.rng.randint(1, 4))
            tools = [self.tool(n) for n in names]
        elif self.chance(0.03):
            tools = []  # an empty list is not None: "{% if tools %}" is false, "is none" too
        messages = []
        if self.chance(0.45):
            messages.append({"role": "system", "content": self.content()})
        turns = self.pick([1, 1, 2, 2, 3, 4, 5, 6, 8])
        for turn in range(turns):
            if (self.family in ("qwen3", "generic") and self.chance(0.05) and messages
                    and messages[-1]["role"] == "assistant"):
                # Qwen 3 treats a user turn that is only a tool response as part
                # of the previous step.
                messages.append({"role": "user",
                                 "content": "<tool_response>\n" + self.text() + "\n</tool_response>"})
            messages.append(self.user())
            last = turn == turns - 1
            if last and self.chance(0.5):
                break  # ends on the user: the generation prompt's case
            use_tools = self.chance(self.weights["calls"] if tools is not None else self.weights["calls"] / 8)
            if use_tools:
                for _ in range(self.pick([1, 1, 1, 2])):
                    call = self.assistant_calls(names)
                    messages.append(call)
                    if last and self.chance(0.15):
                        break  # ends on the calls
                    messages += self.tool_results(call["tool_calls"])
                else:
                    if not (last and self.chance(0.2)):  # else it ends on tool results
                        messages.append(self.assistant_text())
            else:
                messages.append(self.assistant_text())
        return messages, tools

    def malformed(self, messages):
        """Breaks a conversation the way callers get it wrong."""
        r = self.rng.randrange(8)
        if r == 0 and len(messages) > 1:
            first = 1 if messages[0]["role"] == "system" else 0
            messages.insert(first, {"role": "assistant", "content": self.text()})  # assistant first
        elif r == 1:
            i = self.rng.randrange(len(messages))
            messages.insert(i, {"role": "user", "content": self.text()})  # two users in a row, perhaps
        elif r == 2:
            i = self.rng.randrange(len(messages) + 1)
            messages.insert(i, {"role": self.pick(ROLES_UNKNOWN), "content": self.text()})
        elif r == 3:
            i = self.rng.randrange(1, len(messages) + 1)
            messages.insert(i, {"role": "system", "content": self.text()})  # system not first
        elif r == 4:
            messages.append({"role": "assistant", "content": self.text()})
            messages.append({"role": "assistant", "content": self.text()})
        elif r == 5:
            # Content of a type the template may not take: null for a user, parts.
            i = self.rng.randrange(len(messages))
            messages[i] = dict(messages[i], content=self.pick([None, self.parts()]))
        elif r == 6:
            messages.insert(0, {"role": "tool", "content": self.text(), "tool_call_id": "call_0"})
        else:
            messages[:] = [{"role": "system", "content": self.text()}]  # nothing but a system prompt
        return messages

    def record(self):
        messages, tools = self.conversation()
        if self.chance(0.12):
            messages = self.malformed(messages)
        record = {"messages": messages}
        if tools is not None:
            record["tools"] = tools
        record["add_generation_prompt"] = self.chance(0.75 if messages[-1]["role"] != "assistant" else 0.2)
        kwargs = {}
        r = self.rng.random()
        if r < self.weights["thinking"]:
            kwargs["enable_thinking"] = self.pick([True, False])
        elif r < self.weights["thinking"] + 0.03:
            kwargs["enable_thinking"] = self.pick([0, 1, None, "false"])  # not a bool: "is false" says no
        if self.chance(0.03):
            kwargs["bos_token"] = self.pick(["<BOS-override>", ""])  # a kwarg beats the tokenizer's token
        if self.chance(0.05):
            kwargs["custom_flag"] = self.value()  # ignored by these templates
        if kwargs or self.chance(0.1):
            record["kwargs"] = kwargs
        return record


def generate(seed, count, family):
    corpus = ChatCorpus(random.Random("%s/%d" % (family, seed)), family)
    return [corpus.record() for _ in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=2000, help="number of conversations")
    parser.add_argument("--family", choices=FAMILIES, default="generic",
                        help="the template to aim at (default: a mix for all of them)")
    parser.add_argument("--out", help="output file (default: stdout)")
    args = parser.parse_args()

    records = generate(args.seed, args.count, args.family)
    out = open(args.out, "w", encoding="utf-8", newline="\n") if args.out else sys.stdout
    with out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    turns = sum(len(r["messages"]) for r in records)
    print("make_chat_corpus: %d conversations (%s), %d messages, %d with tools"
          % (len(records), args.family, turns, sum("tools" in r for r in records)), file=sys.stderr)


if __name__ == "__main__":
    main()
