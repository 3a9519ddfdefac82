"""chunkattn-loadgen (bench/) against real coordinators, prefix sharing on and
off, through the gRPC API and through the OpenAI-compatible HTTP API."""
import json
import os
import subprocess
import tempfile
import unittest

import harness

REQUESTS, NP, NS, NC = 8, 160, 128, 8


def run_loadgen(*args, timeout=300):
    return subprocess.run([harness.bin_path('chunkattn-loadgen')] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout)


class LoadgenTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        if not os.access(harness.bin_path('chunkattn-loadgen'), os.X_OK):
            raise unittest.SkipTest('build/bin/chunkattn-loadgen is missing')
        cls.shared = cls.start_cluster('loadgen-shared', tp=1)
        cls.unshared = cls.start_cluster('loadgen-unshared', tp=1,
                                         coordinator_args=['--prefix_sharing=false'])

    def run_workload(self, cluster, http=False, namespace=''):
        before = cluster.cache_stats()
        front = ['--http', 'http://127.0.0.1:%d' % cluster.http_port] if http else []
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, 'out.json')
            r = run_loadgen('--server', '127.0.0.1:%d' % cluster.port, '--rate', 20,
                            '--requests', REQUESTS, '--np', NP, '--ns', NS, '--nc', NC,
                            '--seed', 3, '--cache_namespace', namespace, '--json', path, *front)
            self.assertEqual(r.returncode, 0, 'stdout:\n%s\nstderr:\n%s' % (r.stdout, r.stderr))
            with open(path) as f:
                out = json.load(f)
        self.assertEqual((out['requests'], out['ok'], out['np'], out['ns'], out['nc']),
                         (REQUESTS, REQUESTS, NP, NS, NC))
        self.assertGreater(out['normalized_latency_ms_per_token'], 0)
        self.assertGreater(out['throughput_tokens_per_s'], 0)
        self.assertLessEqual(out['ttft_p50_ms'], out['ttft_p99_ms'])
        self.assertLessEqual(out['itl_p50_ms'], out['itl_p99_ms'])
        self.assertGreater(out['itl_p50_ms'], 0)
        self.assertGreaterEqual(out['peak_running_requests'], 1)
        self.assertIn('commit', out)
        self.assertEqual(out['front'], 'http' if http else 'grpc')
        self.assertRegex(out['completion_digest'], '^[0-9a-f]{16}$')
        # The coordinator counted exactly the tokens the load generator received.
        stats = cluster.cache_stats()
        self.assertEqual(stats.generation_tokens_total - before.generation_tokens_total, REQUESTS * NC)
        self.assertEqual(stats.prompt_tokens_total - before.prompt_tokens_total, REQUESTS * NP)
        self.assertEqual(out['cached_prompt_tokens'],
                         stats.cached_prompt_tokens_total - before.cached_prompt_tokens_total)
        self.assertEqual(out['peak_used_chunks'], stats.peak_used_chunks)
        chunk_bytes = cluster.model_info().kv_chunk_bytes
        self.assertEqual(out['peak_kv_bytes'], stats.peak_used_chunks * chunk_bytes)
        return out

    def test_sharing_on_and_off(self):
        on = self.run_workload(self.shared, namespace=harness.fresh_namespace('on'))
        off = self.run_workload(self.unshared, namespace=harness.fresh_namespace('off'))
        self.assertTrue(on['prefix_sharing'])
        self.assertFalse(off['prefix_sharing'])
        # Every request after the first finds at least the shared prompt's
        # whole chunks computed (arrivals 50 ms apart on average; the first
        # may overlap, so allow it to miss).
        chunk = self.shared.model_info().chunk_size
        self.assertGreaterEqual(on['cached_prompt_tokens'], (REQUESTS - 2) * (NS // chunk) * chunk)
        self.assertEqual(off['cached_prompt_tokens'], 0)
        self.assertEqual(off['peak_kv_bytes'], off['peak_kv_unshared_bytes'])
        self.assertLessEqual(on['peak_kv_bytes'], on['peak_kv_unshared_bytes'])
        if on['peak_running_requests'] >= 2:  # sequences ran together: their shared chunks were one copy
            self.assertLess(on['peak_kv_bytes'], on['peak_kv_unshared_bytes'])
        print('sharing on: %s\nsharing off: %s' % (on, off))
        # A later run on the same coordinator reports its own peaks: one short
        # request needs at most ceil((n_p + n_c) / chunk) chunks, far fewer
        # than the first run's peak.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, 'small.json')
            r = run_loadgen('--server', '127.0.0.1:%d' % self.shared.port, '--rate', 20, '--requests', 1,
                            '--np', 20, '--ns', 0, '--nc', 4, '--seed', 99, '--json', path)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(path) as f:
                small = json.load(f)
        self.assertGreaterEqual(small['peak_used_chunks'], 1)
        self.assertLessEqual(small['peak_used_chunks'], -(-24 // chunk))
        self.assertLess(small['peak_used_chunks'], on['peak_used_chunks'])

    def test_http_front_matches_grpc(self):
        """The same workload through either front, each in a fresh namespace:
        the same completions token for token (greedy), the same cache use."""
        for cluster in (self.unshared, self.shared):
            via_grpc = self.run_workload(cluster, namespace=harness.fresh_namespace('grpc'))
            via_http = self.run_workload(cluster, http=True, namespace=harness.fresh_namespace('http'))
            print('%s: grpc %s\nhttp %s' % (cluster.name, via_grpc, via_http))
            self.assertEqual(via_http['completion_digest'], via_grpc['completion_digest'])
            self.assertEqual(via_http['http'], 'http://127.0.0.1:%d' % cluster.http_port)
            if cluster is self.shared:
                chunk = cluster.model_info().chunk_size
                self.assertGreaterEqual(via_http['cached_prompt_tokens'], (REQUESTS - 2) * (NS // chunk) * chunk)
            else:
                self.assertEqual(via_http['cached_prompt_tokens'], 0)

    def test_bad_flags_exit_2(self):
        server = '127.0.0.1:%d' % self.shared.port
        for args in (['--ns', 200, '--np', 100], ['--rate', 0], ['--requests', 0], ['--nc', 0],
                     ['--server', 'nohost'], ['--np', 100000], ['--http', 'https://127.0.0.1:1'],
                     ['--http', '127.0.0.1:8000'], ['--http', 'http://127.0.0.1:0']):
            r = run_loadgen('--server', server, *args)
            self.assertEqual(r.returncode, 2, '%s: %s' % (args, r.stderr))
            self.assertTrue(r.stderr.strip(), args)
        # An HTTP front that does not answer, or answers for another server: exit 1 or 2, never a hang.
        r = run_loadgen('--server', server, '--http', 'http://127.0.0.1:%d' % harness.free_port(), timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn('/v1/models', r.stderr)


if __name__ == '__main__':
    harness.main()
