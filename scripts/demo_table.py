#!/usr/bin/env python3
"""The demo's closing table: two `chunkattn replay --json` summaries of the same
workload, prefix sharing on and off, side by side with their ratios, in under
80 columns.

  /usr/bin/python3 scripts/demo_table.py ON.json OFF.json

Exits 1 with a message when a file is missing or not such a summary."""
import json
import sys

MIB = 1024.0 * 1024.0
KEYS = ['ok', 'failed', 'prompt_tokens', 'cached_prompt_tokens', 'computed_prompt_tokens', 'tokens_per_s',
        'ttft_p50_ms', 'ttft_p99_ms', 'kv_chunk_bytes', 'peak_used_chunks', 'prefix_sharing']


def load(path):
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit('demo_table: cannot read %s: %s' % (path, e))
    missing = [k for k in KEYS if not isinstance(run, dict) or k not in run]
    if missing:
        raise SystemExit('demo_table: %s is not a replay summary (missing %s)' % (path, ', '.join(missing)))
    return run


def ratio(a, b):
    return '%.2fx' % (a / b) if b else '-'


def table(on, off):
    mib = lambda run: run['peak_used_chunks'] * run['kv_chunk_bytes'] / MIB  # noqa: E731
    rows = [
        ('requests', '%d ok' % on['ok'], '%d ok' % off['ok'], ''),
        ('prompt tokens computed', '{:,}'.format(on['computed_prompt_tokens']),
         '{:,}'.format(off['computed_prompt_tokens']), ratio(on['computed_prompt_tokens'], off['computed_prompt_tokens'])),
        ('prompt tokens from cache', '{:,}'.format(on['cached_prompt_tokens']),
         '{:,}'.format(off['cached_prompt_tokens']), ''),
        ('peak KV chunks', '{:,}'.format(on['peak_used_chunks']), '{:,}'.format(off['peak_used_chunks']),
         ratio(on['peak_used_chunks'], off['peak_used_chunks'])),
        ('peak KV memory', '%.1f MiB' % mib(on), '%.1f MiB' % mib(off), ratio(mib(on), mib(off))),
        ('time to first token p50', '%.0f ms' % on['ttft_p50_ms'], '%.0f ms' % off['ttft_p50_ms'],
         ratio(on['ttft_p50_ms'], off['ttft_p50_ms'])),
        ('time to first token p99', '%.0f ms' % on['ttft_p99_ms'], '%.0f ms' % off['ttft_p99_ms'],
         ratio(on['ttft_p99_ms'], off['ttft_p99_ms'])),
        ('generated tokens/s', '%.1f' % on['tokens_per_s'], '%.1f' % off['tokens_per_s'],
         ratio(on['tokens_per_s'], off['tokens_per_s'])),
    ]
    head = ('', 'sharing on', 'sharing off', 'on / off')
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    line = lambda r: '  '.join([r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in (1, 2, 3)])  # noqa: E731
    out = [line(head), '-' * len(line(head))] + [line(r) for r in rows]
    # The headline, in words.
    less = lambda a, b: 100.0 * (1 - a / b) if b else 0.0  # noqa: E731
    out += ['', 'Sharing computed %.0f%% fewer prompt tokens and used %.0f%% less KV memory;' % (
        less(on['computed_prompt_tokens'], off['computed_prompt_tokens']), less(mib(on), mib(off))),
        'the first token came %s sooner (p50), generation ran %s faster.' % (
            ratio(off['ttft_p50_ms'], on['ttft_p50_ms']), ratio(on['tokens_per_s'], off['tokens_per_s']))]
    return '\n'.join(out)


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    on, off = load(argv[1]), load(argv[2])
    if not on['prefix_sharing'] or off['prefix_sharing']:
        raise SystemExit('demo_table: give the sharing-on summary first, then the sharing-off one')
    print(table(on, off))
    if on['failed'] or off['failed']:
        print('\nsome requests failed: sharing on %d, sharing off %d' % (on['failed'], off['failed']))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
