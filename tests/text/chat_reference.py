#!/usr/bin/python3
"""Renders Hugging Face chat templates the way transformers does: the reference
side of the differential chat-template test (test_chat_templates.py).

transformers' apply_chat_template (tokenization_utils_base.py) calls
render_jinja_template (utils/chat_template_utils.py), which compiles the
template in a jinja2 environment of its own making and renders it with the
conversation. This script builds the same environment and passes the same
variables, so its output is what `tokenizer.apply_chat_template(messages,
tools=..., add_generation_prompt=..., tokenize=False, **kwargs)` returns,
without needing transformers (or torch) installed.

The environment, as transformers configures it:
  - jinja2.sandbox.ImmutableSandboxedEnvironment (no attributes starting with
    "_", no mutating methods such as list.append or dict.update), with
    trim_blocks=True and lstrip_blocks=True and otherwise jinja2's defaults:
    autoescape off, Undefined (not StrictUndefined) for missing names, keys and
    attributes, keep_trailing_newline=False (one newline at the very end of
    the template is dropped), newlines in template text normalized to "\\n";
  - extensions: jinja2.ext.loopcontrols ({% break %}, {% continue %}) and
    transformers' AssistantTracker, which adds {% generation %} ...
    {% endgeneration %}; outside return_assistant_tokens_mask the block renders
    its body unchanged, and that is all this script does with it;
  - the filter tojson replaced by json.dumps(value, ensure_ascii=False,
    indent=None, separators=None, sort_keys=False), each keyword overridable
    from the template; so no HTML escaping, ", " and ": " separators (with an
    indent: "," and ": "), keys in the order the input gave them;
  - globals raise_exception(message), which raises jinja2's TemplateError with
    exactly that message, and strftime_now(format), datetime.now().strftime.

The variables: messages, tools (None when the line has none), documents
(None), add_generation_prompt (a bool, default False), then the tokenizer's
special-tokens map overlaid by the line's kwargs (`{**special_tokens_map,
**kwargs}`: a kwarg such as bos_token wins). The special-tokens map is read
from tokenizer_config.json as transformers 4.x builds special_tokens_map:
bos_token, eos_token, unk_token, sep_token, pad_token, cls_token and
mask_token, each as its string (the file writes a string, or an AddedToken as
an object with "content"), present only when set and non-empty;
additional_special_tokens, a list of strings, when non-empty; and each entry
of an "extra_special_tokens" object (Gemma 3's boi_token, eoi_token,
image_token).

The template: --template's file when given (a chat_template.jinja, read as
is), else tokenizer_config.json's "chat_template": a string, or a list of
{"name", "template"} from which transformers takes "tool_use" when the line
passes tools and the list has one, else "default".

Usage:
  chat_reference.py --tokenizer-config PATH [--template PATH] < in.jsonl > out.jsonl

Input: one JSON object a line (lines split on "\\n" only):
  {"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool
   (optional, default false), "kwargs": {...} (optional)}
Output: one line per input line, in order, UTF-8 without ASCII escaping:
  {"text": "..."} or {"error": "...", "error_type": "..."}
  error is the exception's message: for raise_exception exactly its argument,
  with error_type "raise_exception"; for any other failure (an undefined value
  used, a type error in the template, a sandbox refusal) error_type is the
  exception's class name (UndefinedError, TypeError, SecurityError...).
Exit status: 0 when every line was rendered or answered with an error; 1 on
bad usage, a missing or unreadable file, no template, or an input line that
is not a JSON object.
"""

import argparse
import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The special-token attributes transformers' tokenizers know by name, in the
# order its special_tokens_map lists them.
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What raise_exception() raises. transformers raises TemplateError itself;
    a subclass renders identically and lets us tell the template's own errors
    from the engine's."""


def _raise_exception(message):
    raise RaisedByTemplate(message)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers swaps out jinja2's tojson, which escapes <, >, & and ' for
    # HTML and forces sorted keys, for plain json.dumps with these defaults.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker
    records where such a block's output lands (for return_assistant_tokens_mask)
    and otherwise renders the body as is, which is all a prompt needs."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body", [], [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_environment():
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _token_text(value):
    """A special token as tokenizer_config.json writes it: a string, or an
    AddedToken object {"__type": "AddedToken", "content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens_map(config):
    """The special tokens transformers passes to every template, as strings."""
    tokens = {}
    for key in NAMED_SPECIAL_TOKENS:
        text = _token_text(config.get(key))
        if text:  # transformers leaves out unset and empty tokens
            tokens[key] = text
    additional = config.get("additional_special_tokens")
    if isinstance(additional, list):
        texts = [t for t in (_token_text(v) for v in additional) if t is not None]
        if texts:
            tokens["additional_special_tokens"] = texts
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        for key, value in extra.items():
            text = _token_text(value)
            if text:
                tokens[key] = text
    return tokens


class Renderer:
    """One tokenizer_config.json (and optional template file), compiled once."""

    def __init__(self, config, template_source=None):
        self.environment = make_environment()
        self.special_tokens = special_tokens_map(config)
        if template_source is not None:
            self.templates = {None: template_source}
        else:
            chat_template = config.get("chat_template")
            if isinstance(chat_template, str):
                self.templates = {None: chat_template}
            elif isinstance(chat_template, list):
                self.templates = {entry["name"]: entry["template"] for entry in chat_template}
            else:
                raise ValueError("the tokenizer config has no chat_template and no --template was given")
        self._compiled = {}

    def _template_for(self, tools):
        if None in self.templates:
            name = None
        elif tools is not None and "tool_use" in self.templates:
            name = "tool_use"
        elif "default" in self.templates:
            name = "default"
        else:
            raise ValueError("the chat_template list has no \"default\" template (names: %s)"
                             % ", ".join(sorted(self.templates)))
        if name not in self._compiled:
            self._compiled[name] = self.environment.from_string(self.templates[name])
        return self._compiled[name]

    def render(self, record):
        """{"text": ...} or {"error": ..., "error_type": ...} for one input record."""
        tools = record.get("tools")
        kwargs = record.get("kwargs") or {}
        try:
            template = self._template_for(tools)
            text = template.render(messages=record.get("messages"), tools=tools, documents=None,
                                   add_generation_prompt=record.get("add_generation_prompt", False),
                                   **{**self.special_tokens, **kwargs})
        except RaisedByTemplate as e:
            return {"error": str(e), "error_type": "raise_exception"}
        except Exception as e:  # the template failed: the line's answer, not ours
            return {"error": str(e), "error_type": type(e).__name__}
        return {"text": text}


def read_lines(stream):
    """Yields each line's bytes, split on b"\\n" only (a JSON string may hold a
    raw U+2028 or U+0085, which str.splitlines would split on)."""
    pending = b""
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-config", required=True, help="tokenizer_config.json")
    parser.add_argument("--template", help="a chat template file to use instead of the config's")
    args = parser.parse_args()

    if tuple(int(p) for p in jinja2.__version__.split(".")[:2]) < (3, 1):
        sys.exit("chat_reference: transformers needs jinja2 >= 3.1, found %s" % jinja2.__version__)
    try:
        with open(args.tokenizer_config, encoding="utf-8") as f:
            config = json.load(f)
        source = None
        if args.template:
            with open(args.template, encoding="utf-8") as f:
                source = f.read()
        renderer = Renderer(config, source)
    except (OSError, ValueError) as e:
        sys.exit("chat_reference: %s" % e)

    out = sys.stdout.buffer
    for number, line in enumerate(read_lines(sys.stdin.buffer), 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError as e:
            sys.exit("chat_reference: line %d: not UTF-8 JSON: %s" % (number, e))
        if not isinstance(record, dict):
            sys.exit("chat_reference: line %d: not a JSON object" % number)
        result = json.dumps(renderer.render(record), ensure_ascii=False)
        try:
            out.write(result.encode("utf-8") + b"\n")
        except UnicodeEncodeError:
            sys.exit("chat_reference: line %d: a lone surrogate (\\ud800-\\udfff) has no UTF-8 form"
                     % number)
    out.flush()


if __name__ == "__main__":
    main()
