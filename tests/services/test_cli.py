"""The `chunkattn` command-line client against a running coordinator."""
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import harness


def run_cli(*args, timeout=240):
    return subprocess.run([harness.bin_path('chunkattn')] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout)


def watch_while(server, interval_s, action):
    """Runs `chunkattn stats --watch`, and action() once the watch has shown
    its first panel (traffic sent before it would fall before the first
    interval, unseen); sends the signal action returns, if any; (exit code,
    stdout, stderr), never hanging."""
    watch = subprocess.Popen([harness.bin_path('chunkattn'), 'stats', '--server', server, '--watch',
                              '--interval_s', str(interval_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    out, err = [], []
    first_panel = threading.Event()

    def read(stream, lines, panel_end):
        for line in stream:
            lines.append(line)
            if panel_end and line.startswith('requests '):
                first_panel.set()
        first_panel.set()  # the watch ended: the caller's checks say how

    readers = [threading.Thread(target=read, args=(watch.stdout, out, True), daemon=True),
               threading.Thread(target=read, args=(watch.stderr, err, False), daemon=True)]
    for t in readers:
        t.start()
    try:
        first_panel.wait(30)
        sig = action()
        if sig is not None:
            watch.send_signal(sig)
        watch.wait(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        for t in readers:
            t.join(10)
    return watch.returncode, ''.join(out), ''.join(err)


USAGE_LINE = re.compile(r'^finish=(\w+) prompt_tokens=(\d+) cached_prompt_tokens=(\d+) '
                        r'completion_tokens=(\d+)$', re.M)


class CliTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        if not os.access(harness.bin_path('chunkattn'), os.X_OK):
            raise unittest.SkipTest('build/bin/chunkattn is missing')
        cls.cluster = cls.start_cluster('cli', shared=True, tp=1)
        cls.server = '127.0.0.1:%d' % cls.cluster.port

    def check(self, r, rc=0):
        self.assertEqual(r.returncode, rc, 'stdout:\n%s\nstderr:\n%s' % (r.stdout, r.stderr))

    def test_generate(self):
        prompt = 'To be, or not to be'
        r = run_cli('generate', '--server', self.server, '--max-new-tokens', 8, '--temperature', 0,
                    '--ignore_eos', prompt)
        self.check(r)
        m = USAGE_LINE.search(r.stderr)
        self.assertIsNotNone(m, r.stderr)
        self.assertEqual(m.group(1), 'length')
        self.assertEqual(int(m.group(4)), 8)
        api = self.cluster.generate(harness.make_request(text=prompt, temperature=0.0,
                                                         max_new_tokens=8, ignore_eos=True))[0]
        self.assertEqual(int(m.group(2)), api.prompt_tokens)
        self.assertEqual(r.stdout, api.text if api.text.endswith('\n') else api.text + '\n')

    def test_generate_samples_and_ids(self):
        r = run_cli('generate', '--server', self.server, '--prompt_ids', '5,6,7,8', '--n', 2,
                    '--temperature', 1, '--seed', 3, '--max_new_tokens', 4)
        self.check(r)
        self.assertIn('[sample 0]', r.stdout)
        self.assertIn('[sample 1]', r.stdout)
        self.assertEqual(len(re.findall(r'^sample=\d finish=\w+ prompt_tokens=4 ', r.stderr, re.M)), 2,
                         r.stderr)

    def test_rpc_error(self):
        r = run_cli('generate', '--server', self.server, '--prompt_ids', '5,999999', '--timeout_s', 30)
        self.check(r, 1)
        self.assertRegex(r.stderr, r'(?m)^error: INVALID_ARGUMENT: ')

    def test_bad_flags_exit_2_before_any_rpc(self):
        demo = os.path.join(harness.SOURCE, 'data', 'demo')
        files = ['--system_prompt_file', os.path.join(demo, 'system_prompt.txt'),
                 '--prompts_file', os.path.join(demo, 'prompts.txt')]
        for args in (['info', '--server', 'nonsense'],
                     ['info', '--server', '127.0.0.1:99999'],
                     ['info'],
                     ['generate', '--server', self.server, '--temperature', -1, 'hi'],
                     ['generate', '--server', self.server],
                     ['replay', '--server', self.server, '--requests', 0] + files,
                     ['replay', '--server', self.server, '--concurrency', 0] + files,
                     ['replay', '--server', self.server, '--prompts_file', '/nonexistent/prompts.txt',
                      '--system_prompt_file', files[1]],
                     ['stats', '--server', self.server, '--watch', '--interval_s', 0],
                     ['stats', '--server', self.server, '--watch', '--count', -1],
                     ['stats', '--server', self.server, '--count', 2],
                     ['frobnicate', '--server', self.server]):
            with self.subTest(args=args):
                r = run_cli(*args, timeout=30)
                self.check(r, 2)
                self.assertTrue(r.stderr.strip(), 'no message')
        r = run_cli('--help', timeout=30)
        self.check(r)
        for sub in ('generate', 'info', 'tokenize', 'stats', 'replay'):
            self.assertIn(sub, r.stdout)

    def test_info_tokenize_stats(self):
        r = run_cli('info', '--server', self.server)
        self.check(r)
        self.assertRegex(r.stdout, r'(?m)^tensor_parallel_size: 1$')
        self.assertRegex(r.stdout, r'(?m)^chunk_size: 64 tokens$')
        r = run_cli('tokenize', '--server', self.server, 'To be, or not to be')
        self.check(r)
        tok = self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(text='To be, or not to be'),
                                         timeout=30)
        self.assertIn('ids: %s\n' % ','.join(map(str, tok.token_ids)), r.stdout)
        r = run_cli('stats', '--server', self.server)
        self.check(r)
        self.assertRegex(r.stdout, r'(?m)^capacity_chunks: [1-9]\d*$')
        r = run_cli('health', '--server', self.server, '--timeout_s', 10)
        self.check(r)
        self.assertEqual(r.stdout, 'SERVING\n')

    def test_stats_watch(self):
        """A live view: one panel per refresh (blocks when not a terminal), the
        hit rate over the last interval from real traffic, a clean end on
        Ctrl-C, and a clear one when the server goes away."""
        panel = re.compile(r'chunkattn cache at (\S+), every ([0-9.]+) s \(Ctrl-C to stop\)\n'
                           r'chunks    \[[#+.]{40}\] used ([\d,]+)  cached ([\d,]+)  free ([\d,]+)  of ([\d,]+)\n'
                           r'shared    [\d,]+ chunks held by 2\+ sequences; [\d,]+ tokens of KV stored as [\d,]+ '
                           r'\([0-9.]+% saved\)\n'
                           r'prompts   hit rate (.+) over the last interval, (\S+) since start\n'
                           r'generate  (\S+) tokens/s, ([\d,]+) tokens since start\n'
                           r'requests  ([\d,]+) running, ([\d,]+) waiting; .*\n')
        num = lambda s: int(s.replace(',', ''))  # noqa: E731
        r = run_cli('stats', '--server', self.server, '--watch', '--interval_s', 0.2, '--count', 3, timeout=60)
        self.check(r)
        self.assertNotIn('\x1b', r.stdout)  # not a terminal: no escape codes
        panels = panel.findall(r.stdout)
        self.assertEqual(len(panels), 3, r.stdout)
        capacity = self.cluster.cache_stats().capacity_chunks
        for p in panels:
            self.assertEqual(p[0], self.server)
            self.assertEqual(num(p[2]) + num(p[3]) + num(p[4]), capacity)
            self.assertEqual(num(p[5]), capacity)
        self.assertEqual((panels[0][6], panels[0][8]), ('-', '-'))  # no interval before the first refresh
        self.assertEqual(panels[1][6], '- (no prompts)')
        # Traffic while watching: the same long prompt twice, so the last
        # interval's hit rate is from the second request.
        def traffic():
            ns = harness.fresh_namespace('watch')
            ids = list(range(20, 20 + 300))
            self.cluster.generate(harness.make_request(prompt_ids=ids, namespace=ns, max_new_tokens=2))
            self.cluster.generate(harness.make_request(prompt_ids=ids, namespace=ns, max_new_tokens=2))
            time.sleep(1.0)  # a few more refreshes see the traffic
            return signal.SIGINT  # as Ctrl-C

        rc, out, err = watch_while(self.server, 0.3, traffic)
        self.assertEqual(rc, 0, err)
        self.assertNotIn('Traceback', err)
        panels = panel.findall(out)
        self.assertGreaterEqual(len(panels), 2, out)
        rates = [p[6] for p in panels if not p[6].startswith('-')]
        self.assertTrue(any(float(x.split('%')[0]) > 0 for x in rates), out)
        self.assertTrue(any(p[8] != '-' and float(p[8]) > 0 for p in panels), out)
        # The server goes away: exit 1 with the RPC error, no hang.
        cluster = self.start_cluster('cli-gone', tp=1)
        def server_leaves():
            time.sleep(0.8)
            cluster.stop()

        rc, out, err = watch_while('127.0.0.1:%d' % cluster.port, 0.2, server_leaves)
        self.assertEqual(rc, 1, err)
        self.assertIn('went away', err)
        self.assertRegex(err, r'(?m)^error: [A-Z_]+: ')
        self.assertGreaterEqual(len(panel.findall(out)), 1, out)
        r = run_cli('stats', '--server', '127.0.0.1:%d' % harness.free_port(), '--watch', '--count', 1, timeout=60)
        self.check(r, 1)
        self.assertIn('cannot be reached', r.stderr)

    def test_replay_demo_prompts(self):
        demo = os.path.join(harness.SOURCE, 'data', 'demo')
        before = self.cluster.cache_stats()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, 'summary.json')
            r = run_cli('replay', '--server', self.server,
                        '--system_prompt_file', os.path.join(demo, 'system_prompt_fewshot.txt'),
                        '--prompts_file', os.path.join(demo, 'prompts.txt'),
                        '--requests', 8, '--max_new_tokens', 8, '--namespace', harness.fresh_namespace('replay'),
                        '--json', path)
            self.check(r)
            with open(path) as f:
                summary = json.load(f)
        # The summary is the server's count of this run, and the long shared
        # prompt is the demo's: well over 1,500 tokens, cached after the first.
        after = self.cluster.cache_stats()
        self.assertEqual((summary['ok'], summary['failed'], summary['requests']), (8, 0, 8))
        self.assertEqual(summary['prompt_tokens'], after.prompt_tokens_total - before.prompt_tokens_total)
        self.assertEqual(summary['cached_prompt_tokens'],
                         after.cached_prompt_tokens_total - before.cached_prompt_tokens_total)
        self.assertEqual(summary['computed_prompt_tokens'], summary['prompt_tokens'] - summary['cached_prompt_tokens'])
        self.assertGreater(summary['prompt_tokens'] / 8, 1500)
        self.assertGreater(summary['cached_prompt_tokens'], 6 * 1500)
        self.assertLessEqual(summary['ttft_p50_ms'], summary['ttft_p99_ms'])
        self.assertGreater(summary['ttft_p50_ms'], 0)
        self.assertTrue(summary['prefix_sharing'])
        self.assertEqual(summary['peak_used_chunks'], after.peak_used_chunks)
        self.assertRegex(r.stdout, r'(?m)^time to first token\s+\d+ ms p50, \d+ ms p99$')
        self.assertRegex(r.stdout, r'(?m)^requests\s+8 ok, 0 failed$')
        m = re.search(r'(?m)^prefix hit rate\s+([0-9.]+)%$', r.stdout)
        self.assertIsNotNone(m, r.stdout)
        self.assertGreater(float(m.group(1)), 0.0)
        self.assertRegex(r.stdout, r'(?m)^KV memory saved\s+[0-9.]+%$')


if __name__ == '__main__':
    harness.main()
