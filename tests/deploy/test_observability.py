"""The Grafana dashboard and the Prometheus rules against a live coordinator:
every PromQL expression names only metrics the coordinator exports (checked
against a real scrape), promtool accepts and unit-tests the rules, and a real
Prometheus scraping a coordinator computes the dashboard's hit-rate expression
to the value the requests sent here imply.

Run: /usr/bin/python3 tests/deploy/test_observability.py --build build [TestClass]
"""
import json
import os
import re
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request
import random

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'services'))
import harness  # noqa: E402

PROMQL_KEYWORDS = {'by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'and',
                   'or', 'unless', 'offset', 'inf', 'nan'}
# Series Prometheus makes itself for every target.
SYNTHETIC = {'up', 'scrape_duration_seconds', 'scrape_samples_scraped'}


def deploy_path(*parts):
    return os.path.join(harness.SOURCE, 'deploy', *parts)


def dashboard():
    with open(deploy_path('grafana', 'chunkattn.json')) as f:
        return json.load(f)


def dashboard_exprs():
    """{panel title: [expr, ...]} over every panel, rows included."""
    out = {}

    def walk(panels):
        for p in panels:
            exprs = [t['expr'] for t in p.get('targets', []) if t.get('expr')]
            if exprs:
                out.setdefault(p['title'], []).extend(exprs)
            walk(p.get('panels', []))
    walk(dashboard()['panels'])
    return out


def alert_exprs():
    with open(deploy_path('prometheus', 'alerts.yml')) as f:
        rules = yaml.safe_load(f)
    return {r['alert']: r['expr'] for g in rules['groups'] for r in g['rules']}


def concrete(expr, window='5m'):
    """A dashboard expression with Grafana's variables filled in."""
    return (expr.replace('$__rate_interval', window).replace('$namespace', '.*')
            .replace('$job', '.*'))


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)             # string literals
    s = re.sub(r'\{[^}]*\}', ' ', s)                         # label matchers
    s = re.sub(r'\[[^\]]*\]', ' ', s)                        # ranges
    s = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', ' ', s)
    names = set()
    for m in re.finditer(r'(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?', s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


class MetricNamesTest(unittest.TestCase):
    """The extractor itself, on expressions whose answer is known."""

    def test_extractor(self):
        self.assertEqual(metric_names('sum by (state) (rate(a_total{x=~"b|c"}[5m])) / on(job) group_left(le) b'),
                         {'a_total', 'b'})
        self.assertEqual(metric_names('histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))'),
                         {'h_bucket'})
        self.assertEqual(metric_names('clamp_min(1 - sum(p) / (sum(l) > 0), 0) and up == 1e3'),
                         {'p', 'l', 'up'})


class RulesTest(unittest.TestCase):
    """promtool on the rules, their unit tests and the example config."""

    def promtool(self, *args):
        r = subprocess.run(['promtool'] + list(args), cwd=deploy_path('prometheus'),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_check_rules(self):
        self.assertIn('SUCCESS: 6 rules found', self.promtool('check', 'rules', 'alerts.yml'))

    def test_rule_unit_tests(self):
        self.assertIn('SUCCESS', self.promtool('test', 'rules', 'alerts_test.yml'))

    def test_check_config(self):
        self.promtool('check', 'config', 'prometheus.yml')

    def test_the_issue_asks_for_these_alerts(self):
        alerts = alert_exprs()
        self.assertIn('chunkattn_kv_chunks', alerts['ChunkattnKVPoolNearlyFull'])
        self.assertIn('chunkattn_workers_ready', alerts['ChunkattnWorkerDown'])


class LiveScrapeTest(harness.ServiceTestCase):
    """Every metric a dashboard panel or alert names is in a real scrape (with
    bearer tokens, so the per-tenant series are exported too)."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        tokens = harness.token_file('scrape-1 acme\n', 'chunkattn-scrape-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('scrape', tp=1, coordinator_args=['--auth_token_file', tokens])

    def test_every_expression_names_an_exported_metric(self):
        rng = random.Random(7)
        for _ in range(2):
            req = harness.make_request(prompt_ids=harness.random_ids(rng, 40), max_new_tokens=3, ignore_eos=True)
            harness.collect(self.cluster.stub.Generate(req, metadata=[('authorization', 'Bearer scrape-1')],
                                                       timeout=120))
        exported = self.cluster.metrics().names()
        expressions = [(title, e) for title, exprs in dashboard_exprs().items() for e in exprs]
        expressions += list(alert_exprs().items())
        self.assertGreater(len(expressions), 20)
        for where, expr in expressions:
            names = metric_names(expr)
            self.assertTrue(names, 'no metric in %s: %s' % (where, expr))
            missing = names - exported - SYNTHETIC
            self.assertFalse(missing, '%s uses metrics the coordinator does not export: %s' %
                             (where, sorted(missing)))

    def test_dashboard_covers_the_cache_and_latency(self):
        used = set()
        for exprs in dashboard_exprs().values():
            for e in exprs:
                used |= metric_names(e)
        for name in ('chunkattn_prompt_tokens_cached_total', 'chunkattn_prompt_tokens_total',
                     'chunkattn_kv_chunks', 'chunkattn_kv_logical_tokens', 'chunkattn_kv_physical_tokens',
                     'chunkattn_kv_shared_chunks', 'chunkattn_kv_evicted_chunks_total', 'chunkattn_requests',
                     'chunkattn_preemptions_total', 'chunkattn_generation_tokens_total',
                     'chunkattn_time_to_first_token_seconds_bucket',
                     'chunkattn_inter_token_latency_seconds_bucket',
                     'chunkattn_step_duration_seconds_bucket',
                     # KV retention: the bands, the per-tenant bound and what it capped.
                     'chunkattn_kv_retention_chunks', 'chunkattn_tenant_kv_retained_chunks',
                     'chunkattn_kv_retention_capped_chunks_total'):
            self.assertIn(name, used)
        # The hit rate is a rate over a window, not a ratio of the lifetime counters.
        for e in hit_rate_exprs():
            self.assertRegex(e, r'rate\(chunkattn_prompt_tokens_cached_total\{[^}]*\}\[\$__rate_interval\]\)')
        quantiles = [e for exprs in dashboard_exprs().values() for e in exprs if 'histogram_quantile' in e]
        self.assertTrue(any(e.startswith('histogram_quantile(0.99') for e in quantiles))
        self.assertTrue(any(e.startswith('histogram_quantile(0.5') for e in quantiles))


def hit_rate_exprs():
    return [e for title, exprs in dashboard_exprs().items() if 'hit rate' in title.lower() for e in exprs]


class Prometheus:
    """A real Prometheus (Debian's) scraping the given target every second."""

    def __init__(self, name, target, tmp):
        self.port = harness.free_port()
        config = os.path.join(tmp, 'prometheus.yml')
        with open(config, 'w') as f:
            yaml.safe_dump({
                'global': {'scrape_interval': '1s', 'scrape_timeout': '1s', 'evaluation_interval': '1s'},
                'rule_files': [deploy_path('prometheus', 'alerts.yml')],
                'scrape_configs': [{'job_name': 'chunkattn-coordinator',
                                    'static_configs': [{'targets': [target]}]}],
            }, f)
        self.process = harness.Process(name, [
            'prometheus', '--config.file=' + config, '--storage.tsdb.path=' + os.path.join(tmp, 'tsdb'),
            '--web.listen-address=127.0.0.1:%d' % self.port, '--log.level=warn']).start()

    def get(self, path, **params):
        url = 'http://127.0.0.1:%d%s' % (self.port, path)
        if params:
            url += '?' + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())

    def ready(self):
        try:
            with urllib.request.urlopen('http://127.0.0.1:%d/-/ready' % self.port, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr):
        """The instant vector's values (floats), or [] when it is empty."""
        reply = self.get('/api/v1/query', query=expr)
        assert reply['status'] == 'success', reply
        return [float(v['value'][1]) for v in reply['data']['result']]


class PrometheusScrapeTest(harness.ServiceTestCase):
    """Debian's Prometheus scrapes a coordinator; the dashboard's hit-rate
    expression returns the cached/prompt token ratio of the requests sent."""

    SHARED_CHUNKS = 4  # the shared prefix, whole 64-token chunks
    REQUESTS = 5
    SUFFIX = 20

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('prometheus', tp=1)
        tmp = harness.temp_dir('chunkattn-prometheus-', cls.addClassCleanup)
        cls.prometheus = Prometheus('prometheus', '127.0.0.1:%d' % cls.cluster.metrics_port, tmp)
        # Class cleanups run last in, first out: Prometheus stops before its folder goes.
        cls.addClassCleanup(cls.prometheus.process.stop)
        harness.wait_for(cls.prometheus.ready, 60, what='prometheus ready')

    def test_hit_rate_expression(self):
        p = self.prometheus
        # A first scrape before any request: every counter's first sample is 0,
        # so rate() over the window sees the whole increase of both counters.
        harness.wait_for(lambda: p.query('chunkattn_prompt_tokens_total') == [0.0], 30,
                         what='a scrape of the idle coordinator')
        info = self.cluster.model_info()
        rng = random.Random(11)
        shared = harness.random_ids(rng, self.SHARED_CHUNKS * info.chunk_size)
        namespace = harness.fresh_namespace('hit-rate')
        prompt_total = cached_total = 0
        for i in range(self.REQUESTS):
            # One at a time, so each request after the first finds the prefix cached.
            sample = self.cluster.generate(harness.make_request(
                prompt_ids=shared + harness.random_ids(rng, self.SUFFIX), namespace=namespace,
                max_new_tokens=2, ignore_eos=True))[0]
            expected_cached = 0 if i == 0 else self.SHARED_CHUNKS * info.chunk_size
            self.assertEqual(sample.cached_prompt_tokens, expected_cached, 'request %d' % i)
            prompt_total += sample.prompt_tokens
            cached_total += sample.cached_prompt_tokens
        expected = (self.REQUESTS - 1) * self.SHARED_CHUNKS * info.chunk_size / (
            self.REQUESTS * (self.SHARED_CHUNKS * info.chunk_size + self.SUFFIX))
        self.assertAlmostEqual(cached_total / prompt_total, expected, places=12)
        # Wait for the scrape that saw the last request.
        harness.wait_for(lambda: p.query('chunkattn_prompt_tokens_total') == [float(prompt_total)], 30,
                         what='the scrape after the last request')
        exprs = hit_rate_exprs()
        self.assertTrue(exprs)
        for expr in exprs:
            values = p.query(concrete(expr, window='10m'))
            self.assertEqual(len(values), 1, expr)
            self.assertAlmostEqual(values[0], expected, places=9, msg=expr)
        # The lifetime totals agree with what the requests reported.
        self.assertEqual(p.query('chunkattn_prompt_tokens_cached_total'), [float(cached_total)])

    def test_rules_load_and_workers_are_up(self):
        p = self.prometheus

        def rules():
            groups = p.get('/api/v1/rules')['data']['groups']
            return {r['name']: r for g in groups for r in g['rules']}

        loaded = harness.wait_for(lambda: len(rules()) == 6 and rules(), 30, what='rules loaded')
        for name, rule in loaded.items():
            self.assertEqual(rule['health'], 'ok', (name, rule.get('lastError')))
        harness.wait_for(lambda: p.query('up{job="chunkattn-coordinator"}') == [1.0], 30, what='up == 1')
        self.assertEqual(p.query('chunkattn_workers_ready'), [1.0])
        # Nothing is wrong, so no alert is pending or firing.
        harness.wait_for(lambda: rules()['ChunkattnWorkerDown'].get('lastEvaluation', '').startswith('20'), 30,
                         what='a rule evaluation')
        self.assertEqual(p.get('/api/v1/alerts')['data']['alerts'], [])


if __name__ == '__main__':
    harness.main()
