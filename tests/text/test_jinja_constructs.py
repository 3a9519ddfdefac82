#!/usr/bin/python3
"""The chat-template engine construct by construct, against jinja2 itself.

test_chat_templates.py renders the templates real models ship; this test
covers the rest of what the issue asks of the engine (the constructs other
families' published templates use: macros, filters, tests, loop variables,
string and list methods, whitespace control, printing of Python values), each
as a small template rendered by build/bin/chunkattn-chat-render (its
{"template", "context"} lines) and by jinja2 configured as transformers
configures it (chat_reference.make_environment). Outputs must be byte-equal;
where jinja2 raises, ours must fail too, with raise_exception's message.

Usage: test_jinja_constructs.py --build BUILD [--source SRC] [unittest args]
"""
import argparse
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat_reference  # noqa: E402

BUILD = None

CONTEXT = {
    's': ' Hello, World ', 'n': 7, 'f': 2.5, 'neg': -3, 'big': 10 ** 15, 'l': [3, 1, 2],
    'words': ['b', 'A', 'c', 'a'], 'd': {'b': 1, 'a': 2, 'C': 3}, 'none': None, 't': True, 'no': False,
    'u8': 'é漢😀\u00a0x', 'text': 'line1\nline2\r\nline3\n', 'empty': [], 'estr': '', 'zero': 0,
    'msgs': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': ' hi '},
             {'role': 'assistant', 'content': None,
              'tool_calls': [{'type': 'function', 'function': {'name': 'f', 'arguments': {'x': 1, 'y': 'z'}}}]},
             {'role': 'tool', 'content': '{"ok": true}', 'tool_call_id': 'c1'}],
    'nested': {'a': {'b': [1, {'c': 'deep'}]}}, 'floats': [0.1, 1e16, 1e-05, -0.0, 3.0, 123456.789],
    'people': [{'name': 'Bo', 'age': 30}, {'name': 'al', 'age': 25}, {'name': 'Cy', 'age': 30}],
}

TEMPLATES = [
    # printing and arithmetic
    '{{ n }} {{ f }} {{ neg }} {{ none }} {{ t }} {{ no }} {{ l }} {{ d }} {{ floats }} {{ u8 }}',
    '{{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ neg % 3 }} {{ neg // 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ f * 2 }}',
    '{{ n + f }} {{ n - 10 }} {{ -n }} {{ +f }} {{ 1e3 }} {{ 1_000 }} {{ 0.1 + 0.2 }} {{ big * 10 }}',
    '{{ "ab" * 3 }} {{ [1] * 3 }} {{ l + [4] }} {{ "a" ~ n ~ none ~ t }} {{ (1, 2) }} {{ (1,) }}',
    "{{ 'it\\'s' }} {{ \"q\\\"d\" }} {{ 'a\\nb' }} {{ '\\u00e9\\x41' }} {{ 'adj' 'acent' }}",
    "{{ ['it\\'s', 'x\"y', 'both\\'\"', 'tab\\t', 'é', '\\x00'] }}",
    # comparisons, logic, conditional expressions
    '{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ n == 7.0 }} {{ "a" < "b" }} {{ [1, 2] < [1, 3] }} {{ t == 1 }}',
    '{{ none or "x" }} {{ "" or 0 or "y" }} {{ 0 and 1 }} {{ 1 and 2 }} {{ not none }} {{ not l }}',
    '{{ "yes" if t else "no" }} {{ "yes" if no else "no" }} [{{ "x" if no }}] {{ 1 if zero else 2 if n else 3 }}',
    '{{ 2 in l }} {{ 5 not in l }} {{ "ell" in s }} {{ "a" in d }} {{ "z" in d }}',
    # tests
    '{{ n is number }} {{ t is number }} {{ n is integer }} {{ t is integer }} {{ f is float }} {{ t is boolean }}',
    '{{ s is string }} {{ l is sequence }} {{ d is mapping }} {{ d is iterable }} {{ none is none }} {{ x is defined }}',
    '{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ n is eq 7 }} {{ n is ne(7) }}',
    '{{ "ab" is lower }} {{ "AB" is upper }} {{ t is true }} {{ 1 is true }} {{ no is false }} {{ 0 is false }}',
    '{{ n is gt 3 }} {{ n is lt(3) }} {{ n is ge 7 }} {{ n is le 6 }} {{ 2 is in l }} {{ none is sameas none }}',
    '{{ s is not string }} {{ d.zz is undefined }} {{ msgs[0] is mapping }} {{ estr is iterable }} {{ 3 is iterable }}',
    # filters
    '[{{ s | trim }}] [{{ s | trim("H ") }}] {{ s | upper }} {{ s | lower }} {{ s | title }} {{ "hELLO" | capitalize }}',
    '{{ l | length }} {{ u8 | length }} {{ d | count }} {{ l | first }} {{ l | last }} {{ l | sum }} {{ l | max }} {{ l | min }}',
    '{{ words | sort }} {{ words | sort(reverse=true) }} {{ words | sort(case_sensitive=true) }} {{ words | unique | list }}',
    '{{ l | sort | join(", ") }} {{ words | join }} {{ l | reverse | list }} {{ "abc" | reverse }} {{ l | list }}',
    '{{ d | dictsort }} {{ d | dictsort(by="value", reverse=true) }} {{ d | items | list }} {{ d | list }}',
    '{{ people | map(attribute="name") | join("/") }} {{ people | selectattr("age", "eq", 30) | map(attribute="name") | list }}',
    '{{ people | rejectattr("age", "equalto", 30) | list }} {{ people | sort(attribute="age") | map(attribute="name") | list }}',
    '{{ l | select("odd") | list }} {{ l | reject("odd") | list }} {{ [0, 1, "", "a", none] | select | list }}',
    '{{ people | sum(attribute="age") }} {{ people | max(attribute="age") }} {{ words | min }} {{ people | map(attribute="nick", default="?") | list }}',
    '{{ ["1", "2.5", "x"] | map("int") | list }} {{ ["1", "2.5", "x"] | map("float") | list }} {{ "42" | int + 1 }} {{ "0x1A" | int(0, 16) }}',
    '{{ 3.7 | int }} {{ -3.7 | int }} {{ 2 | float }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.5 | round(0, "floor") }}',
    '{{ neg | abs }} {{ -2.5 | abs }} {{ none | default("dflt") }} {{ x | default("dflt") }} {{ "" | default("e", true) }} {{ x | d }}',
    '{{ text | indent }}|{{ text | indent(2, true) }}|{{ "a\n\nb" | indent(2, blank=true) }}|{{ "a\nb" | indent("> ") }}',
    '{{ s | replace("l", "L") }} {{ s | replace("l", "L", 1) }} {{ "abc" | replace("", "-") }} {{ s | wordcount }}',
    '{{ n | string }} {{ l | string }} {{ none | string }} {{ "<a&\'>" | e }} {{ "x" | safe }}',
    '{{ l | batch(2) | list }} {{ l | batch(2, 0) | list }} {{ "ab" | center(6) }}|',
    '{{ d | attr("items") is callable }} {{ msgs | map(attribute="role") | unique | list }} {{ nested | tojson }}',
    # tojson, as transformers defines it
    '{{ msgs | tojson }}',
    '{{ msgs[2] | tojson(indent=2) }}',
    '{{ d | tojson(sort_keys=true) }} {{ u8 | tojson }} {{ u8 | tojson(ensure_ascii=true) }} {{ floats | tojson }}',
    '{{ d | tojson(separators=(",", ":")) }} {{ "ctl\x01\x7f\t" | tojson }} {{ [none, t, no, {}] | tojson }}',
    # string methods
    '[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ "xxhixx".strip("x") }}] [{{ text.rstrip("\n") }}]',
    '{{ s.split() }} {{ s.split(",") }} {{ "a,b,,c".split(",", 1) }} {{ "a b  c".rsplit(None, 1) }} {{ text.splitlines() }}',
    '{{ s.startswith(" H") }} {{ s.endswith(("x", "d ")) }} {{ s.upper() }} {{ s.lower() }} {{ "ab cd".title() }}',
    '{{ s.replace(" ", "_") }} {{ s.find("o") }} {{ s.rfind("o") }} {{ s.find("zz") }} {{ s.count("l") }} {{ "-".join(words) }}',
    '{{ "12".isdigit() }} {{ "ab".isalpha() }} {{ "a1".isalnum() }} {{ "  ".isspace() }} {{ "{} and {}".format(1, "x") }}',
    '{{ "x".center(5, "*") }} {{ "x".ljust(3) }}| {{ "x".rjust(3) }} {{ "7".zfill(3) }} {{ "aBc".swapcase() }}',
    '{{ u8[0] }} {{ u8[1:3] }} {{ u8[-1] }} {{ s[::2] }} {{ s[::-1] }} {{ l[-1] }} {{ l[5] is undefined }} {{ l[1:] }} {{ l[::-2] }}',
    # dict and list methods, attribute and item access
    '{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get("a") }} {{ d.get("z", 0) }}',
    '{{ d.a }} {{ d["b"] }} {{ nested.a.b[1].c }} {{ nested["a"]["b"][0] }} {{ msgs[2].tool_calls[0].function.arguments.y }}',
    '{{ l.index(2) }} {{ l.count(3) }} {{ msgs[1].content | trim }} {{ msgs[0]["role"] }} {{ msgs | length }}',
    # loops
    '{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}',
    '{% for x in l %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }} {{ loop.cycle("a", "b") }};{% endfor %}',
    '{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in empty %}{{ x }}{% else %}empty{% endfor %}',
    '{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}',
    '{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %} {% for c in "héllo" %}{{ c }}.{% endfor %} {% for k in d %}{{ k }}{% endfor %}',
    '{% for m in msgs %}{% for tc in m.tool_calls or [] %}{{ tc.function.name }}({{ tc.function.arguments | tojson }}){% endfor %}{% endfor %}',
    '{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }} {% endfor %}{% endfor %} {{ range(10, 0, -3) | list }}',
    '{% set x = 1 %}{% for i in l %}{% set x = x + i %}{{ x }}{% endfor %} {{ x }}',
    # set, namespace, macros
    '{% set ns = namespace(total=0, seen=[]) %}{% for i in l %}{% set ns.total = ns.total + i %}{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }} {{ ns.seen }}',
    '{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t2 = (3, 4) %}{{ t2[1] }} {% set block %}in a {{ "block" }}{% endset %}[{{ block }}]',
    '{% macro item(name, value="?", sep=": ") %}{{ name }}{{ sep }}{{ value }}{% endmacro %}{{ item("a") }} {{ item("b", 2) }} {{ item("c", sep="=", value=3) }}',
    '{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}',
    '{% set d2 = dict(a=1, b=none) %}{{ d2 }} {{ {"k": [1, {"z": none}]} }} {{ {1: "int key"}[1] }}',
    # whitespace control: trim_blocks, lstrip_blocks, - and +
    'a\n  {% if t %}\n  b\n  {% endif %}\nc',
    'a\n  {%- if t %}\n  b\n  {%- endif %}\n  c',
    'x  {%+ if t %} y {% endif +%}\nz',
    '<{{- " sp " -}}>  <{{ " sp " }}>\n{# comment #}\nafter\n  {#- trimmed -#}  done',
    '{% raw %}{{ not rendered }} {% if %}{% endraw %} and {{ "rendered" }}',
    'line\n{% for i in l %}\n  - {{ i }}\n{% endfor %}\nend\n',
    '{%- for m in msgs -%}\n    {{- m.role }}:{{ m.content }}\n{% endfor -%}',
    '{% generation %}gen {{ n }}{% endgeneration %}',
    # failures: jinja2 and we must both fail (raise_exception: same message)
    '{{ raise_exception("Only user and assistant roles are supported!") }}',
    '{% for m in msgs %}{% if m.role == "tool" %}{{ raise_exception("tool at " ~ loop.index0) }}{% endif %}{% endfor %}',
    '{{ x.y }}', '{{ "a" + 1 }}', '{{ n + "a" }}', '{{ l.append(4) }}', '{{ d.update({}) }}', '{{ none.x.y }}',
    '{{ 1 / 0 }}', '{{ range(200000) | length }}', '{{ "a" < 1 }}', '{{ undefined_function() }}',
    '{% for a, b in l %}{% endfor %}', '{{ "{}".format() }}', '{{ 5 in 3 }}', '{{ msgs[2].content.strip() }}',
]


def run_ours(records):
    binary = os.path.join(BUILD, 'bin', 'chunkattn-chat-render')
    if not os.access(binary, os.X_OK):
        raise AssertionError('no %s: build the chunkattn-chat-render target' % binary)
    data = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records).encode('utf-8')
    proc = subprocess.run([binary], input=data, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError('chunkattn-chat-render exited %d: %s' % (proc.returncode, proc.stderr[-2000:]))
    return [json.loads(line) for line in proc.stdout.decode('utf-8').split('\n') if line]


def run_reference(template):
    env = chat_reference.make_environment()
    try:
        return {'text': env.from_string(template).render(**CONTEXT)}
    except chat_reference.RaisedByTemplate as e:
        return {'error': str(e), 'error_type': 'raise_exception'}
    except Exception as e:  # noqa: BLE001 (the template's failure is the answer)
        return {'error': str(e), 'error_type': type(e).__name__}


class JinjaConstructsTest(unittest.TestCase):

    def test_every_construct_renders_as_jinja2(self):
        records = [{'template': t, 'context': CONTEXT} for t in TEMPLATES]
        ours = run_ours(records)
        self.assertEqual(len(ours), len(TEMPLATES))
        failures = []
        errors_expected = 0
        for template, got in zip(TEMPLATES, ours):
            want = run_reference(template)
            if 'text' in want:
                if got.get('text') != want['text']:
                    failures.append('%r\n  jinja2: %r\n  ours:   %r' % (template, want['text'], got))
            else:
                errors_expected += 1
                if 'error' not in got:
                    failures.append('%r\n  jinja2 fails (%s: %s)\n  ours renders %r' % (
                        template, want['error_type'], want['error'], got.get('text')))
                elif want['error_type'] == 'raise_exception' and (
                        got.get('error') != want['error'] or got.get('error_type') != 'raise_exception'):
                    failures.append('%r\n  jinja2 raises %r\n  ours: %r' % (template, want['error'], got))
        self.assertFalse(failures, '%d of %d templates differ from jinja2:\n%s' % (
            len(failures), len(TEMPLATES), '\n'.join(failures)))
        self.assertGreater(errors_expected, 10)  # the failure cases really fail in jinja2
        self.assertGreater(len(TEMPLATES) - errors_expected, 60)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--build', required=True)
    parser.add_argument('--source', default=None)
    args, rest = parser.parse_known_args()
    BUILD = os.path.abspath(args.build)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
