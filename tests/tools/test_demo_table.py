"""scripts/demo_table.py: the demo's side-by-side table from two replay
summaries: the ratios from the numbers given, under 80 columns, and a clear
message (exit 1, no traceback) for a missing, malformed or swapped file."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(SOURCE, 'scripts', 'demo_table.py')


def summary(sharing, computed, cached, chunks, ttft50, ttft99, tps, failed=0):
    return dict(model='demo', prefix_sharing=sharing, tensor_parallel_size=2, requests=32, concurrency=8,
                ok=32 - failed, failed=failed, wall_s=3.0, prompt_tokens=computed + cached,
                cached_prompt_tokens=cached, computed_prompt_tokens=computed, completion_tokens=1024,
                tokens_per_s=tps, ttft_p50_ms=ttft50, ttft_p99_ms=ttft99, kv_chunk_bytes=1 << 20,
                peak_used_chunks=chunks, peak_unshared_chunks=chunks * 4)


class DemoTableTest(unittest.TestCase):

    def run_table(self, on, off):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, doc in (('on.json', on), ('off.json', off)):
                path = os.path.join(d, name)
                with open(path, 'w') as f:
                    f.write(doc if isinstance(doc, str) else json.dumps(doc))
                paths.append(path)
            return subprocess.run([sys.executable, SCRIPT] + paths, capture_output=True, text=True, timeout=60)

    def test_side_by_side_with_ratios(self):
        r = self.run_table(summary(True, 2000, 54000, 30, 40, 90, 300.0),
                           summary(False, 56000, 0, 240, 160, 450, 150.0))
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(all(len(line) < 80 for line in lines), r.stdout)
        row = {line.split('  ')[0]: line.split() for line in lines[2:10]}
        self.assertEqual(lines[-2], 'Sharing computed 96% fewer prompt tokens and used 88% less KV memory;')
        self.assertEqual(lines[-1], 'the first token came 4.00x sooner (p50), generation ran 2.00x faster.')
        self.assertEqual(row['prompt tokens computed'][-3:], ['2,000', '56,000', '0.04x'])
        self.assertEqual(row['peak KV chunks'][-3:], ['30', '240', '0.12x'])
        self.assertEqual(row['peak KV memory'][-5:], ['30.0', 'MiB', '240.0', 'MiB', '0.12x'])
        self.assertEqual(row['time to first token p50'][-5:], ['40', 'ms', '160', 'ms', '0.25x'])
        self.assertEqual(row['generated tokens/s'][-3:], ['300.0', '150.0', '2.00x'])
        failed = self.run_table(summary(True, 1, 1, 1, 1, 1, 1.0, failed=2), summary(False, 1, 0, 1, 1, 1, 1.0))
        self.assertEqual(failed.returncode, 1)
        self.assertIn('some requests failed', failed.stdout)

    def test_bad_input_is_a_message(self):
        good = summary(True, 1, 1, 1, 1, 1, 1.0)
        for on, off in (('{not json', good), (dict(good, prefix_sharing=False), {'ok': 1}),
                        (summary(False, 1, 1, 1, 1, 1, 1.0), summary(True, 1, 1, 1, 1, 1, 1.0)), ('[]', good)):
            r = self.run_table(on, off)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn('demo_table:', r.stderr)
            self.assertNotIn('Traceback', r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, '/nonexistent/a.json', '/nonexistent/b.json'],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn('cannot read', r.stderr)


if __name__ == '__main__':
    unittest.main()
