"""The `chunkattn` command-line client against a running coordinator."""
import os
import re
import subprocess
import unittest

import harness


def run_cli(*args, timeout=240):
    return subprocess.run([harness.bin_path('chunkattn')] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout)


USAGE_LINE = re.compile(r'^finish=(\w+) prompt_tokens=(\d+) cached_prompt_tokens=(\d+) '
                        r'completion_tokens=(\d+)$', re.M)


class CliTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        if not os.access(harness.bin_path('chunkattn'), os.X_OK):
            raise unittest.SkipTest('build/bin/chunkattn is missing')
        cls.cluster = cls.start_cluster('cli', tp=1)
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

    def test_replay_demo_prompts(self):
        demo = os.path.join(harness.SOURCE, 'data', 'demo')
        r = run_cli('replay', '--server', self.server,
                    '--system_prompt_file', os.path.join(demo, 'system_prompt.txt'),
                    '--prompts_file', os.path.join(demo, 'prompts.txt'),
                    '--requests', 8, '--max_new_tokens', 8)
        self.check(r)
        self.assertRegex(r.stdout, r'(?m)^requests\s+8 ok, 0 failed$')
        m = re.search(r'(?m)^prefix hit rate\s+([0-9.]+)%$', r.stdout)
        self.assertIsNotNone(m, r.stdout)
        self.assertGreater(float(m.group(1)), 0.0)
        self.assertRegex(r.stdout, r'(?m)^KV memory saved\s+[0-9.]+%$')


if __name__ == '__main__':
    harness.main()
