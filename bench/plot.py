#!/usr/bin/env python3
"""Charts of the benchmark results: one PNG per chart from bench/results/*.json.

Files are recognized by their content, not their names, so results that do not
exist yet (cuda-<gpu>-*.json, e2e-<gpu>-*.json) are charted the same way:
  kernel rows   a JSON list of rows with impl, np, ns (chunkattn-kernel-bench,
                bench/torch_baseline.py): latency per (n_p, n_s) and impl with
                the memory floor                              -> NAME-kernel.png
  forest        chunkattn-forest-bench's object: per-op costs, tokens and
                chunks                                        -> NAME-forest.png
  loadgen rows  chunkattn-loadgen --json objects (one per file): normalized
                latency against request rate, sharing on and off, all files of
                one set together (a set is the name up to -sharing-on/off or
                -npN-nsN: e2e-<gpu>-sharing-on-np1024-ns0.json and its siblings
                are set e2e-<gpu>)                            -> SET-e2e.png
  fronts        bench/fronts.py: its runs as loadgen rows     -> NAME-e2e.png
                and gRPC against HTTP medians                 -> NAME-fronts.png
  http streams  bench/http_streams.py: TTFT and tokens/s against concurrent
                streams                                       -> NAME-streams.png
  peer          bench/peer/peer_bench.py: chunkattn against llama.cpp per
                workload, as speed-ups                         -> NAME-peer.png
  kv tiers      bench/kv_tiers.py rows: hit rate and TTFT per cluster
                (pool alone, with tiers, unbounded)            -> NAME-tiers.png
Anything else is skipped with a note. Every chart's footer names the machine,
the commit and the command that produced its numbers.

Usage: /usr/bin/python3 bench/plot.py [--results bench/results] [--out bench/plots]
Exits 1 if a file it should chart is malformed or a chart cannot be written
(after doing all the others), 2 without matplotlib (python3-matplotlib).
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import textwrap

HERE = os.path.relpath(os.path.dirname(os.path.abspath(__file__)))  # relative: the printed paths stay short
DPI = 90  # with the sizes below, about 720 x 380 pixels: readable on GitHub, tens of KB each
IMPL_ORDER = ['tpp', 'seq', 'naive', 'torch-flashattn', 'torch-naive']
IMPL_COLORS = {'tpp': '#1f77b4', 'seq': '#ff7f0e', 'naive': '#7f7f7f',
               'torch-flashattn': '#2ca02c', 'torch-naive': '#bcbd22'}
OTHER_COLORS = ['#9467bd', '#8c564b', '#e377c2', '#17becf', '#d62728']
PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b']
# A kernel configuration besides (np, ns): keys constant over a file go in the
# title, varying ones under each group's x label.
KERNEL_KEYS = [('batch', 'b'), ('heads', 'h'), ('kv_heads', 'kv'), ('head_dim', 'd'), ('chunk', 'c'),
               ('dtype', 'dtype')]
# A loadgen file's set is its name up to the first -sharing-on/off or -npN-nsN:
# what follows names one run of the set (cuda_session.sh's e2e steps).
LOADGEN_RUN = re.compile(r'-(sharing-(on|off)|np\d+-ns\d+)(-|$)')
FRONT_NAMES = {'grpc': 'gRPC', 'http': 'HTTP'}
FRONT_METRICS = [('normalized_latency_ms_per_token', 'normalized\nlatency'), ('ttft_p50_ms', 'TTFT p50'),
                 ('ttft_p99_ms', 'TTFT p99'), ('itl_p50_ms', 'inter-token\np50'),
                 ('itl_p99_ms', 'inter-token\np99')]
FOREST_KEYS = ['insert_us', 'appends_per_s', 'decode_step_us_median', 'decode_step_us_p99',
               'context_rebuild_us', 'logical_tokens', 'physical_tokens', 'shared_chunks', 'used_chunks']

plt = ticker = None  # matplotlib's, imported in main() so that a missing package is one clear message


class Malformed(Exception):
    """A file this script should chart lacks a field or has one of the wrong type."""


# ---- recognizing and checking the results ----------------------------------------

def num(obj, key, where):
    v = obj.get(key) if isinstance(obj, dict) else None
    # bool is an int to Python; true where a number belongs is still an error.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Malformed('%s: "%s" missing or not a finite number (%r)' % (where, key, v))
    return v


def field(obj, key, kind, where):
    v = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(v, kind):
        raise Malformed('%s: "%s" missing or not a %s (%r)' % (where, key, kind.__name__, v))
    return v


def ok(row):
    """Failed kernel rows ("ok": false) carry an error instead of timings."""
    return row.get('ok', True) is not False


def check_kernel(doc):
    for i, r in enumerate(doc):
        where = 'row %d' % i
        field(r, 'impl', str, where)
        for key in ['np', 'ns'] + (['median_us', 'floor_us'] if isinstance(r, dict) and ok(r) else []):
            num(r, key, where)
    return doc


def check_loadgen(rows, where):
    for i, r in enumerate(rows):
        for key in ('rate', 'normalized_latency_ms_per_token', 'np', 'ns', 'nc'):
            num(r, key, '%s[%d]' % (where, i))
        field(r, 'prefix_sharing', bool, '%s[%d]' % (where, i))
    return rows


def check_fronts(doc):
    """The runs as loadgen rows, after checking the medians too."""
    runs, medians = field(doc, 'runs', dict, 'fronts'), field(doc, 'medians', dict, 'fronts')
    if not medians:
        raise Malformed('fronts: "medians" is empty')
    for f in medians:
        for key, _ in FRONT_METRICS + [('throughput_tokens_per_s', '')]:
            num(medians[f], key, 'medians.%s' % f)
    rows = [r for f in runs for r in check_loadgen(field(runs, f, list, 'runs'), 'runs.' + f)]
    if not rows:
        raise Malformed('fronts: no runs')
    return rows


def check_streams(doc):
    levels = field(doc, 'levels', list, 'http_streams')
    if not levels:
        raise Malformed('http_streams: "levels" is empty')
    for i, lv in enumerate(levels):
        for key in ('concurrency', 'ttft_p50_ms', 'ttft_p99_ms', 'tokens_per_s'):
            num(lv, key, 'levels[%d]' % i)
    return doc


def check_forest(doc):
    for key in FOREST_KEYS:
        num(doc, key, 'forest')
    return doc


def classify(doc):
    """The kind of results a document holds, or None."""
    if isinstance(doc, list):
        if any(isinstance(r, dict) and 'impl' in r and 'np' in r for r in doc):
            return 'kernel'
        if doc and all(isinstance(r, dict) and 'normalized_latency_ms_per_token' in r for r in doc):
            return 'loadgen'
        if doc and all(isinstance(r, dict) and r.get('benchmark') == 'kv_tiers' for r in doc):
            return 'tiers'
        return None
    if not isinstance(doc, dict):
        return None
    kind = {'forest': 'forest', 'fronts': 'fronts', 'http_streams': 'streams',
            'peer-llamacpp': 'peer'}.get(doc.get('benchmark'))
    if kind is None and 'normalized_latency_ms_per_token' in doc:
        kind = 'loadgen'
    return kind


# ---- figure furniture ---------------------------------------------------------------

def short_commit(c):
    m = re.match(r'([0-9a-f]{40})(.*)$', str(c))
    return m.group(1)[:7] + m.group(2) if m else str(c)


def few(values, n=3):
    values = list(dict.fromkeys(values))  # distinct, in order
    return ', '.join(values[:n]) + (' (+%d more)' % (len(values) - n) if len(values) > n else '')


def footer(sources):
    """Machine, commit, date and command of the dicts that carry them, compactly
    when they differ: the chart says where its numbers came from, as the JSON does."""
    sources = [s for s in sources if isinstance(s, dict)]
    machines = ['%s (%s, %s cores)' % (s.get('machine', '?'), s['cpu'], s.get('cores', '?'))
                if 'cpu' in s else str(s.get('machine', '?')) for s in sources]
    commits = list(dict.fromkeys(short_commit(s.get('commit', 'unknown')) for s in sources))
    days = sorted(set(str(s['time'])[:10] for s in sources if 'time' in s))
    line = 'machine: %s   commit%s: %s' % (few(machines, 2), 's' if len(commits) > 1 else '', few(commits))
    if days:
        line += '   ' + (days[0] if len(days) == 1 else '%s to %s' % (days[0], days[-1]))
    commands = list(dict.fromkeys(str(s.get('command', '?')) for s in sources))
    cmd = ('command: ' + commands[0] if len(commands) == 1 else
           '%d commands, e.g.: %s' % (len(commands), commands[0]))
    return [line] + textwrap.wrap(cmd, 150, subsequent_indent='    ', break_on_hyphens=False)[:3]


def figure(width, height, foot, ncols=1, width_ratios=None):
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False,
                             gridspec_kw={'width_ratios': width_ratios} if width_ratios else None)
    fig.text(0.008, 0.008, '\n'.join(foot), fontsize=6, color='#444444', va='bottom', family='monospace')
    return fig, list(axes[0])


def save(fig, foot, path):
    # The footer gets its own band below the axes.
    fig.tight_layout(rect=(0, (0.12 + 0.085 * len(foot)) / fig.get_figheight(), 1, 1))
    # No "Software" stamp: the same results and matplotlib give the same bytes.
    fig.savefig(path, dpi=DPI, metadata={'Software': None})


def style(ax):
    ax.grid(True, which='major', axis='y', color='#dddddd', linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=7)
    for side in ('top', 'right'):
        ax.spines[side].set_visible(False)


def fmt_us(v, _pos=None):
    if v >= 1e6:
        return '%g s' % (v / 1e6)
    if v >= 1e3:
        return '%g ms' % (v / 1e3)
    return '%g us' % v


def number_key(c):
    """Sorts tuples mixing numbers, strings and None (a missing key)."""
    return [(0, x, '') if isinstance(x, (int, float)) else (1, 0, str(x)) for x in c]


# ---- the charts -----------------------------------------------------------------------

def chart_kernel(rows, path):
    """Grouped bars, one group per configuration and a bar per impl, on a log
    scale (the grid spans 100x); the memory floor is a black line across each
    group and seq / tpp, the paper's point, is written above it."""
    keys = [k for k, _ in KERNEL_KEYS]
    cfg = lambda r: (r['np'], r['ns']) + tuple(r.get(k) for k in keys)
    configs = sorted(set(cfg(r) for r in rows), key=number_key)
    impls = sorted(set(r['impl'] for r in rows),
                   key=lambda i: (IMPL_ORDER.index(i) if i in IMPL_ORDER else len(IMPL_ORDER), i))
    varying = [i for i in range(len(keys)) if len(set(c[2 + i] for c in configs)) > 1]
    constant = ' '.join(('%s' if short == 'dtype' else short + '=%s') % configs[0][2 + i]
                        for i, (_, short) in enumerate(KERNEL_KEYS)
                        if i not in varying and configs[0][2 + i] is not None)
    cell = {(cfg(r), r['impl']): r for r in rows}  # a repeated (config, impl): the last row, as a rerun
    timed = [r for r in cell.values() if ok(r)]
    failed = len(cell) - len(timed)

    foot = footer(rows)
    fig, (ax,) = figure(8, 4.2, foot)
    width = 0.8 / len(impls)
    others = iter(OTHER_COLORS * 4)
    for j, impl in enumerate(impls):
        xs, ys = [], []
        for x, c in enumerate(configs):
            r = cell.get((c, impl))
            bx = x - 0.4 + width * (j + 0.5)
            if r is not None and ok(r):
                xs.append(bx)
                ys.append(r['median_us'])
            elif r is not None:
                ax.text(bx, 0.02, 'x', color='#d62728', ha='center', fontsize=8, transform=ax.get_xaxis_transform())
        ax.bar(xs, ys, width, label=impl, color=IMPL_COLORS.get(impl) or next(others))
    floor_label = 'memory floor'
    ratios = 0
    for x, c in enumerate(configs):
        floors = [r['floor_us'] for r in timed if cfg(r) == c]
        if floors:
            ax.hlines(min(floors), x - 0.45, x + 0.45, colors='black', linewidth=1.5, label=floor_label)
            floor_label = None
        t, q = cell.get((c, 'tpp')), cell.get((c, 'seq'))
        if t and q and ok(t) and ok(q):
            ax.text(x, max(t['median_us'], q['median_us']) * 1.15, '%.2fx' % (q['median_us'] / t['median_us']),
                    ha='center', va='bottom', fontsize=6.5)
            ratios += 1
    ax.set_yscale('log')
    if timed:  # every bar and floor in view, headroom for the ratios and the legend
        lows = [r['median_us'] for r in timed] + [r['floor_us'] for r in timed]
        ax.set_ylim(min(lows) / 2.5, max(r['median_us'] for r in timed) * 4)
    else:
        ax.set_ylim(1, 10)
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(fmt_us))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(['%d / %d' % c[:2] + ''.join('\n%s=%s' % (KERNEL_KEYS[i][1], c[2 + i]) for i in varying)
                        for c in configs], fontsize=7)
    ax.set_xlabel('n_p / n_s (prompt tokens / shared prefix tokens)', fontsize=8)
    ax.set_ylabel('median latency (log scale)', fontsize=8)
    ax.set_title('Decode attention, one layer: %s%s\n%s%s' % (
        constant, ' (above the bars: seq / tpp)' if ratios else '',
        few(sorted(set(str(r.get('device', '?')) for r in rows)), 2),
        '; %d failed row%s marked x' % (failed, '' if failed == 1 else 's') if failed else ''), fontsize=9)
    style(ax)
    ax.legend(fontsize=7, ncol=min(6, len(impls) + 1), loc='upper left', frameon=False)
    save(fig, foot, path)


def chart_forest(d, path):
    """Three panels: the bookkeeping's cost per operation (log: 0.1 us to ms),
    KV tokens stored against tokens referenced, and chunks shared of those used."""
    ops = [('insert (1 prompt)', d['insert_us']), ('append (1 token)', 1e6 / d['appends_per_s']),
           ('decode step, median', d['decode_step_us_median']), ('decode step, p99', d['decode_step_us_p99']),
           ('full context rebuild', d['context_rebuild_us'])]
    foot = footer([d])
    fig, (a0, a1, a2) = figure(8, 3.6, foot, ncols=3)
    a0.barh(range(len(ops)), [v for _, v in ops], color='#1f77b4')
    a0.set_yticks(range(len(ops)))
    a0.set_yticklabels([n for n, _ in ops], fontsize=7)
    a0.invert_yaxis()
    a0.set_xscale('log')
    a0.xaxis.set_major_formatter(ticker.FuncFormatter(fmt_us))
    for i, (_, v) in enumerate(ops):
        a0.text(v, i, ' ' + fmt_us(float('%.3g' % v)), va='center', fontsize=6.5)
    a0.set_xlim(right=max(v for _, v in ops) * 20)
    a0.set_title('cost per operation (log)', fontsize=8)
    logical, physical = d['logical_tokens'], d['physical_tokens']
    a1.bar([0, 1], [logical / 1e6, physical / 1e6], color=['#7f7f7f', '#2ca02c'])
    a1.set_xticks([0, 1])
    a1.set_xticklabels(['logical', 'physical'], fontsize=7)
    a1.set_ylabel('KV tokens (millions)', fontsize=7)
    a1.set_title('KV tokens: %.1f%% saved' % (100 * (1 - physical / logical)) if logical else 'KV tokens',
                 fontsize=8)
    a2.bar([0, 1], [d['used_chunks'], d['shared_chunks']], color=['#7f7f7f', '#ff7f0e'])
    a2.set_xticks([0, 1])
    a2.set_xticklabels(['used', 'shared'], fontsize=7)
    a2.set_ylabel('chunks', fontsize=7)
    a2.set_title('chunks of %s tokens' % d['chunk_size'] if 'chunk_size' in d else 'chunks', fontsize=8)
    for ax in (a0, a1, a2):
        style(ax)
    a0.grid(True, axis='x', color='#dddddd', linewidth=0.6)
    a0.grid(False, axis='y')
    fig.suptitle('Prefix forest bookkeeping: %s live sequences, decode steps of %s' % (
        d.get('sequences', '?'), d.get('batch', '?')), fontsize=9)
    save(fig, foot, path)


def chart_e2e(title, rows, sources, path):
    """The paper's normalized-latency figure: ms/token against requests per
    second, a panel per n_p, a line per (n_s, sharing, front) through the
    medians of repeated runs (each run a faint dot); one rate gives points."""
    front = lambda r: r.get('front', 'grpc')
    nps = sorted(set(r['np'] for r in rows))
    fronts = set(front(r) for r in rows)
    ncs = sorted(set(r['nc'] for r in rows))
    foot = footer(sources)
    fig, axes = figure(min(8, 3.2 + 2.6 * len(nps)), 3.8, foot, ncols=len(nps))
    for ax, np_ in zip(axes, nps):
        mine = [r for r in rows if r['np'] == np_]
        key = lambda r: (r['ns'], r['nc'], r['prefix_sharing'], front(r))
        series = sorted(set(key(r) for r in mine), key=lambda s: (s[0], s[1], not s[2], s[3]))
        nss = sorted(set(s[0] for s in series))
        lo, hi = min(r['rate'] for r in mine), max(r['rate'] for r in mine)
        for k, s in enumerate(series):
            ns, nc, sharing, fr = s
            pts = [r for r in mine if key(r) == s]
            rates = sorted(set(r['rate'] for r in pts))
            med = [statistics.median(r['normalized_latency_ms_per_token'] for r in pts if r['rate'] == x)
                   for x in rates]
            label = 'n_s=%d, sharing %s' % (ns, 'on' if sharing else 'off')
            label += ', n_c=%d' % nc if len(ncs) > 1 else ''
            label += ', ' + FRONT_NAMES.get(fr, fr) if len(fronts) > 1 else ''
            # At a single rate the series would hide each other: set them side
            # by side around it (the one tick marks the rate itself).
            dodge = (k - (len(series) - 1) / 2) * 0.03 * (lo or 1) if lo == hi else 0
            color = PALETTE[nss.index(ns) % len(PALETTE)]
            ax.plot([x + dodge for x in rates], med, color=color, linestyle='-' if sharing else '--',
                    marker='o' if fr == 'grpc' else 's', markersize=5,
                    markerfacecolor=color if sharing else 'white', label=label)
            if len(pts) > len(rates):
                ax.scatter([r['rate'] + dodge for r in pts], [r['normalized_latency_ms_per_token'] for r in pts],
                           s=8, color=color, alpha=0.35)
        if lo == hi:
            ax.set_xlim(lo - 0.15 * (lo or 1), hi + 0.15 * (hi or 1))
            ax.set_xticks([lo])
        else:
            ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set_ylim(bottom=0)
        ax.set_title('n_p = %d' % np_, fontsize=8)
        ax.set_xlabel('request rate (requests/s)', fontsize=7)
        style(ax)
        ax.legend(fontsize=6, frameon=False, loc='lower right')
    axes[0].set_ylabel('normalized latency (ms/token)', fontsize=7)
    short = sum(1 for r in rows if isinstance(r.get('ok'), int) and isinstance(r.get('requests'), int)
                and r['ok'] < r['requests'])
    fig.suptitle('%s: normalized latency against request rate (%d runs, n_c = %s%s)' % (
        title, len(rows), '/'.join(str(n) for n in ncs),
        '; %d with failed requests' % short if short else ''), fontsize=9)
    save(fig, foot, path)


def chart_fronts(d, path):
    """Each front's medians as bars (a ms panel and a tokens/s panel), each
    repeat a dot, the ratio to the first front above the others' bars."""
    medians, runs = d['medians'], d['runs']
    fronts = list(medians)
    name = lambda f: FRONT_NAMES.get(f, f)
    foot = footer([d])
    fig, (a0, a1) = figure(8, 3.8, foot, ncols=2, width_ratios=[4, 1])
    width = 0.8 / len(fronts)
    for j, f in enumerate(fronts):
        for ax, metrics in ((a0, FRONT_METRICS), (a1, [('throughput_tokens_per_s', 'throughput')])):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(metrics))]
            ax.bar(xs, [medians[f][k] for k, _ in metrics], width, color=PALETTE[j % len(PALETTE)],
                   label=name(f) if ax is a0 else None)
            for x, (k, _) in zip(xs, metrics):
                vals = [r[k] for r in runs.get(f, []) if isinstance(r.get(k), (int, float))]
                ax.scatter([x] * len(vals), vals, s=6, color='black', zorder=3)
                if j > 0 and medians[fronts[0]][k]:
                    ax.text(x, max(vals + [medians[f][k]]) * 1.02, '%.2fx' % (medians[f][k] / medians[fronts[0]][k]),
                            ha='center', va='bottom', fontsize=6)
    a0.set_xticks(range(len(FRONT_METRICS)))
    a0.set_xticklabels([label for _, label in FRONT_METRICS], fontsize=7)
    a0.set_ylabel('ms', fontsize=7)
    a0.legend(fontsize=7, frameon=False)
    a1.set_xticks([0])
    a1.set_xticklabels(['throughput'], fontsize=7)
    a1.set_ylabel('tokens/s', fontsize=7)
    for ax in (a0, a1):
        style(ax)
    same = d.get('same_completions')
    fig.suptitle('%s: %s requests at %s/s, n_p=%s n_s=%s n_c=%s, median of %s (dots: runs; ratio to %s)%s' % (
        ' vs '.join(name(f) for f in fronts), d.get('requests', '?'), d.get('rate', '?'), d.get('np', '?'),
        d.get('ns', '?'), d.get('nc', '?'), d.get('repeats', '?'), name(fronts[0]),
        '' if same is None else '; same tokens: %s' % ('yes' if same else 'NO')), fontsize=8.5)
    save(fig, foot, path)


def chart_streams(d, path):
    """TTFT p50/p99 and tokens/s against concurrent streams (log x: the levels
    span 1 to 1000), each repeat a faint dot."""
    levels = sorted(d['levels'], key=lambda lv: lv['concurrency'])
    x = [lv['concurrency'] for lv in levels]
    runs = lambda key: [(lv['concurrency'], r[key]) for lv in levels for r in lv.get('runs', [])
                        if isinstance(r, dict) and isinstance(r.get(key), (int, float))]
    foot = footer([d])
    fig, (a0, a1) = figure(8, 3.6, foot, ncols=2)
    for ax, key, label, color in ((a0, 'ttft_p50_ms', 'TTFT p50', '#1f77b4'),
                                  (a0, 'ttft_p99_ms', 'TTFT p99', '#d62728'),
                                  (a1, 'tokens_per_s', None, '#2ca02c')):
        ax.plot(x, [lv[key] for lv in levels], marker='o', color=color, label=label)
        ax.scatter([c for c, _ in runs(key)], [v for _, v in runs(key)], s=8, color=color, alpha=0.3)
    for lv in levels:
        if lv.get('completed', lv['concurrency']) != lv['concurrency']:
            a1.annotate('%s/%s done' % (lv.get('completed'), lv['concurrency']),
                        (lv['concurrency'], lv['tokens_per_s']), fontsize=6)
    a0.set_yscale('log')
    a0.set_ylabel('time to first token (ms, log)', fontsize=7)
    a0.legend(fontsize=7, frameon=False)
    a1.set_ylabel('generated tokens/s', fontsize=7)
    a1.set_ylim(bottom=0)
    for ax in (a0, a1):
        ax.set_xscale('log')
        ax.set_xticks(x)
        ax.set_xticklabels([str(v) for v in x])
        ax.minorticks_off()
        ax.set_xlabel('concurrent streams', fontsize=7)
        style(ax)
    fig.suptitle('OpenAI-compatible HTTP front, streamed completions of %s tokens (median of %s; dots: runs)'
                 % (d.get('max_tokens', '?'), d.get('repeats', '?')), fontsize=9)
    save(fig, foot, path)


def chart_peer(d, path):
    """Per workload, how many times better chunkattn does than llama.cpp
    (time ratios inverted so right is always better; log x), each bar
    labelled with both raw values."""
    rows = [r for r in d['rows'] if isinstance(r.get('chunkattn'), (int, float))
            and isinstance(r.get('llamacpp'), (int, float)) and r['chunkattn'] > 0 and r['llamacpp'] > 0]
    speedup = [r['llamacpp'] / r['chunkattn'] if r.get('better') == 'lower' else r['chunkattn'] / r['llamacpp']
               for r in rows]
    foot = footer([d])
    fig, (ax,) = figure(8, 0.9 + 0.32 * len(rows), foot)
    y = list(range(len(rows)))[::-1]
    ax.barh(y, speedup, color=['#2ca02c' if s >= 1 else '#d62728' for s in speedup], height=0.6)
    ax.axvline(1, color='#444444', linewidth=0.8)
    for yi, s, r in zip(y, speedup, rows):
        ax.annotate('%.2fx  (%.3g vs %.3g %s)' % (s, r['chunkattn'], r['llamacpp'], r.get('unit', '')), (s, yi),
                    xytext=(4, 0), textcoords='offset points', va='center', fontsize=6)
    ax.set_yticks(y)
    ax.set_yticklabels([textwrap.shorten(r['workload'], 70) for r in rows], fontsize=6)
    ax.set_xscale('log')
    ax.set_xlim(min(speedup + [1]) / 1.5, max(speedup) * 8)
    ax.set_xlabel('chunkattn vs llama.cpp (x better; log)', fontsize=7)
    style(ax)
    fig.suptitle('CPU path beside llama.cpp (node-llama-cpp), %s threads, %s' % (d.get('threads', '?'),
                                                                               d.get('model', {}).get('name', '156M Llama')
                                                                               if isinstance(d.get('model'), dict)
                                                                               else '156M Llama'), fontsize=9)
    save(fig, foot, path)


def chart_tiers(rows, path):
    """Prompt-token hit rate and TTFT p50/p90 per cluster; the two-replica
    and decode rows (host and disk tier), when there, in the title."""
    extra = {r['config']: r for r in rows if r.get('config') == 'shared' or r.get('config', '').startswith('decode')}
    rows = [r for r in rows if r.get('config') not in extra]
    names = [r['config'] for r in rows]
    foot = footer(rows[:1])
    fig, (a0, a1) = figure(8, 3.4, foot, ncols=2)
    x = list(range(len(rows)))
    a0.bar(x, [100 * r['hit_rate'] for r in rows], color='#1f77b4', width=0.6)
    for xi, r in zip(x, rows):
        a0.annotate('%.1f%%' % (100 * r['hit_rate']), (xi, 100 * r['hit_rate']), ha='center', va='bottom',
                    fontsize=7)
    a0.set_ylabel('prompt tokens cached (%)', fontsize=7)
    a0.set_ylim(0, 105)
    a1.bar([xi - 0.18 for xi in x], [r['ttft_p50_ms'] for r in rows], width=0.36, color='#2ca02c', label='p50')
    a1.bar([xi + 0.18 for xi in x], [r['ttft_p90_ms'] for r in rows], width=0.36, color='#ff7f0e', label='p90')
    a1.set_ylabel('time to first token, turns 2+ (ms)', fontsize=7)
    a1.legend(fontsize=7, frameon=False)
    for ax in (a0, a1):
        ax.set_xticks(x)
        ax.set_xticklabels(names, fontsize=7)
        style(ax)
    r0 = rows[0]
    title = 'KV tiers: %s conversations x %s turns, %s tenants, a %s MiB pool' % (
        r0.get('conversations', '?'), r0.get('turns', '?'), r0.get('tenants', '?'), r0.get('pool_mib', '?'))
    if 'shared' in extra:
        sh = extra['shared']
        title += '\ntwo replicas, one Redis: B\'s first requests %.0f%% cached, TTFT p50 %.0f ms (%.0f ms alone)' % (
            100 * sh['hit_rate'], sh['ttft_p50_ms'], sh['ttft_p50_alone_ms'])
    ratios = ['%s %.3f' % (extra[n].get('tier', 'host'), extra[n].get('mean_step_ratio', extra[n]['step_ratio']))
              for n in ('decode', 'decode_disk') if n in extra]
    if ratios:
        title += '\nmean decode step with loads / without: ' + ', '.join(ratios)
    fig.suptitle(title, fontsize=9)
    save(fig, foot, path)


# ---- driver ----------------------------------------------------------------------------

def plan(stem, doc, loadgen_sets):
    """The charts of one results document, as (name, function, args); loadgen
    rows go to their set, charted once every file is read."""
    kind = classify(doc)
    if kind == 'kernel':
        return [(stem + '-kernel.png', chart_kernel, (check_kernel(doc),))]
    if kind == 'forest':
        return [(stem + '-forest.png', chart_forest, (check_forest(doc),))]
    if kind == 'streams':
        return [(stem + '-streams.png', chart_streams, (check_streams(doc),))]
    if kind == 'peer':
        return [(stem + '-peer.png', chart_peer, (doc,))]
    if kind == 'tiers':
        return [(stem + '-tiers.png', chart_tiers, (doc,))]
    if kind == 'fronts':
        # The runs' own commands name loadgen and a temporary port: the file's say how to rerun it.
        return [(stem + '-e2e.png', chart_e2e, (stem, check_fronts(doc), [doc])),
                (stem + '-fronts.png', chart_fronts, (doc,))]
    if kind == 'loadgen':
        rows = check_loadgen(doc if isinstance(doc, list) else [doc], 'rows')
        m = LOADGEN_RUN.search(stem)
        loadgen_sets.setdefault(stem[:m.start()] if m and m.start() else stem, []).extend(rows)
        return []
    return None


def main():
    global plt, ticker
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--results', default=os.path.join(HERE, 'results'), help='folder of *.json results')
    ap.add_argument('--out', default=os.path.join(HERE, 'plots'), help='folder for the PNGs')
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot
        import matplotlib.ticker
        plt, ticker = matplotlib.pyplot, matplotlib.ticker
    except ImportError as e:
        print('plot.py: error: matplotlib is missing (%s): apt-get install python3-matplotlib, '
              'or scripts/install-deps.sh' % e, file=sys.stderr)
        return 2

    files = sorted(glob.glob(os.path.join(args.results, '*.json')))
    if not files:
        print('plot.py: error: no *.json in %s' % args.results, file=sys.stderr)
        return 1
    errors = []
    jobs = []  # (chart name, function, args, the results it charts)
    loadgen_sets = {}  # set name -> rows
    for path in files:
        try:
            with open(path) as f:
                doc = json.load(f)
            charts = plan(os.path.basename(path)[:-len('.json')], doc, loadgen_sets)
        except (OSError, ValueError) as e:  # ValueError: not JSON
            errors.append('%s: not readable JSON: %s' % (path, e))
            continue
        except Malformed as e:
            errors.append('%s: %s' % (path, e))
            continue
        if charts is None:
            print('skip %s: not results plot.py charts (kernel rows, forest, loadgen, fronts, http streams)' % path)
        jobs += [chart + (path,) for chart in charts or []]
    for name, rows in sorted(loadgen_sets.items()):
        jobs.append((name + '-e2e.png', chart_e2e, (name, rows, rows), os.path.join(args.results, name + '*.json')))

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print('plot.py: error: cannot make %s: %s' % (args.out, e), file=sys.stderr)
        return 1
    names = [job[0] for job in jobs]
    for name, fn, fargs, source in jobs:
        out = os.path.join(args.out, name)
        if names.count(name) > 1:
            errors.append('%s: another results file also makes %s; rename one' % (source, name))
            continue
        try:
            fn(*fargs, out)
            print('wrote %s' % out)
        except Exception as e:  # a chart that cannot be drawn or written: say which, do the others
            errors.append('%s: cannot write the chart: %s: %s' % (out, type(e).__name__, e))
        finally:
            plt.close('all')
    for e in errors:
        print('plot.py: error: %s' % e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
