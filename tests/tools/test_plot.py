"""bench/plot.py: every committed result it knows becomes a valid PNG, the
charts committed in bench/plots/ (embedded in bench/README.md) are the ones it
makes, results shaped like the GPU session's (cuda-<gpu>-*.json,
e2e-<gpu>-*.json) chart too, and a malformed file or an unwritable folder
makes it fail with a message, never a traceback. python3-matplotlib missing
fails this test: it is a test dependency (scripts/install-deps.sh).

Usage: test_plot.py [--source DIR] [unittest args]   (DIR: the checkout, by default this file's)
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PYTHON = '/usr/bin/python3' if os.access('/usr/bin/python3', os.X_OK) else sys.executable
# The charts of the committed results, by results file (required while the file is there).
COMMITTED = {
    'cpu-2core-epyc.json': ['cpu-2core-epyc-kernel.png'],
    'forest-cpu-2core-epyc.json': ['forest-cpu-2core-epyc-forest.png'],
    'fronts-cpu-2core.json': ['fronts-cpu-2core-e2e.png', 'fronts-cpu-2core-fronts.png'],
    'http-streams-cpu-2core.json': ['http-streams-cpu-2core-streams.png'],
    'peer-llamacpp-cpu-2core.json': ['peer-llamacpp-cpu-2core-peer.png'],
    'kv-tiers-cpu-2core.json': ['kv-tiers-cpu-2core-tiers.png'],
}
MAX_PNG_BYTES = 200 * 1024  # "a few tens of KB": a chart this big has lost its modest size


def png_size(path):
    """(width, height) from the IHDR chunk, which must come first."""
    with open(path, 'rb') as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b'\x89PNG\r\n\x1a\n':
        raise AssertionError('%s: not a PNG' % path)
    length, tag = struct.unpack('>I4s', head[8:16])
    if tag != b'IHDR' or length != 13:
        raise AssertionError('%s: the first chunk is not IHDR' % path)
    return struct.unpack('>II', head[16:24])


def write_json(folder, name, doc):
    with open(os.path.join(folder, name), 'w') as f:
        json.dump(doc, f)


class PlotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = subprocess.run([PYTHON, '-c', 'import matplotlib'], capture_output=True, text=True)
        if r.returncode != 0:  # a failure, not a skip: the charts are part of the test suite
            raise AssertionError('python3-matplotlib is missing for %s (scripts/install-deps.sh): %s'
                                 % (PYTHON, r.stderr.strip()))
        # matplotlib's font cache goes here (built once for the class), not into $HOME.
        cls.mplconfig = tempfile.mkdtemp(prefix='chunkattn-plot-mpl-')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.mplconfig, ignore_errors=True)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='chunkattn-plot-')
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.env = dict(os.environ, MPLCONFIGDIR=self.mplconfig, PYTHONDONTWRITEBYTECODE='1')

    def plot(self, results, out=None, env=None):
        out = out or os.path.join(self.tmp, 'out')
        r = subprocess.run([PYTHON, os.path.join(SOURCE, 'bench', 'plot.py'), '--results', results, '--out', out],
                           capture_output=True, text=True, timeout=120, env=env or self.env)
        self.assertNotIn('Traceback', r.stdout + r.stderr)
        written = [line.split(' ', 1)[1] for line in r.stdout.splitlines() if line.startswith('wrote ')]
        return r, sorted(os.path.basename(p) for p in written), out

    def assert_charts(self, out, written):
        self.assertEqual(sorted(os.listdir(out)), written, 'the folder holds exactly the charts it printed')
        for name in written:
            path = os.path.join(out, name)
            w, h = png_size(path)
            self.assertGreater(w, 0, name)
            self.assertGreater(h, 0, name)
            self.assertLess(os.path.getsize(path), MAX_PNG_BYTES, name)

    def test_committed_results(self):
        results = os.path.join(SOURCE, 'bench', 'results')
        r, written, out = self.plot(results)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assert_charts(out, written)
        present = set(os.listdir(results))
        expected = {c for f, charts in COMMITTED.items() if f in present for c in charts}
        # GPU results, once collected, chart by name: each kernel file, each e2e set.
        for f in present:
            if f.startswith('cuda-') and f.endswith('.json'):
                expected.add(f[:-len('.json')] + '-kernel.png')
            m = re.match(r'(e2e-.+?)-(sharing-(on|off)|np\d+-ns\d+)(-|\.json$)', f)
            if m:
                expected.add(m.group(1) + '-e2e.png')
        self.assertTrue(expected, 'no committed results to chart')
        self.assertEqual(sorted(expected - set(written)), [], r.stdout)

        # The committed charts are these, no more (stale) and no fewer: README's images are current.
        committed = sorted(n for n in os.listdir(os.path.join(SOURCE, 'bench', 'plots')) if n.endswith('.png'))
        self.assertEqual(committed, written, 'bench/plots/ is out of date: run /usr/bin/python3 bench/plot.py')
        with open(os.path.join(SOURCE, 'bench', 'README.md')) as f:
            shown = set(re.findall(r'\]\(plots/([^)]+\.png)\)', f.read()))
        self.assertTrue(shown, 'bench/README.md shows no chart')
        self.assertEqual(sorted(shown - set(committed)), [], 'bench/README.md shows charts that do not exist')

    def test_gpu_shaped_results(self):
        results = os.path.join(self.tmp, 'results')
        os.makedirs(results)
        prov = dict(machine='gpu-host', cpu='Some CPU', cores=16, commit='0123456789abcdef' * 2 + '01234567',
                    time='2026-12-01T00:00:00Z')
        rows = []
        for np_, ns in ((1024, 0), (1024, 1024), (4096, 2048)):
            for impl in ('tpp', 'seq', 'naive'):
                row = dict(prov, command='chunkattn-kernel-bench --device cuda --grid paper', impl=impl,
                           device='NVIDIA H100 80GB HBM3', np=np_, ns=ns, batch=32, heads=32, kv_heads=32,
                           head_dim=128, chunk=64, dtype='fp16')
                if (np_, ns, impl) == (4096, 2048, 'naive'):  # a failed configuration's row
                    row.update(ok=False, error='INTERNAL: launch failed')
                else:
                    row.update(ok=True, median_us=10.0 + ns / 100 + len(impl), floor_us=8.0)
                rows.append(row)
        write_json(results, 'cuda-nvidia-h100-paper-fp16.json', rows)
        write_json(results, 'cuda-nvidia-h100-c32.json', [
            dict(prov, command='kb --chunk %d' % c, impl=impl, np=4096, ns=4096, chunk=c, median_us=30.0 + c,
                 floor_us=22.5, ok=True) for c in (32, 128) for impl in ('tpp', 'seq')])
        write_json(results, 'cuda-nvidia-h100-torch.json', [
            dict(prov, command='torch_baseline.py', impl='torch-' + i, np=1024, ns=0, median_us=50.0,
                 floor_us=40.0) for i in ('flashattn', 'naive')])
        # The GPU session's e2e rows: one loadgen object per file, one rate per (n_p, n_s).
        for sharing in ('on', 'off'):
            for np_, ns, rate in ((1024, 0, 1.0), (1024, 1024, 1.0), (4096, 4096, 0.4)):
                write_json(results, 'e2e-nvidia-h100-sharing-%s-np%d-ns%d.json' % (sharing, np_, ns), dict(
                    prov, command='chunkattn-loadgen --rate %g --np %d --ns %d' % (rate, np_, ns), front='grpc',
                    prefix_sharing=sharing == 'on', rate=rate, requests=12, ok=12 if sharing == 'on' else 11,
                    np=np_, ns=ns, nc=512, normalized_latency_ms_per_token=20.0 + ns / 100))
        # A sweep over rates, as a list in one file.
        write_json(results, 'sweep.json', [
            dict(prov, command='chunkattn-loadgen', prefix_sharing=s, rate=rate, np=2048, ns=1024, nc=64,
                 normalized_latency_ms_per_token=10.0 + rate * (1 if s else 3))
            for s in (True, False) for rate in (0.5, 1.0, 2.0, 2.0)])
        r, written, out = self.plot(results)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(written, ['cuda-nvidia-h100-c32-kernel.png', 'cuda-nvidia-h100-paper-fp16-kernel.png',
                                   'cuda-nvidia-h100-torch-kernel.png', 'e2e-nvidia-h100-e2e.png',
                                   'sweep-e2e.png'])
        self.assert_charts(out, written)
        # Deterministic: the same results give the same bytes.
        r2, written2, out2 = self.plot(results, os.path.join(self.tmp, 'again'))
        self.assertEqual(written2, written)
        for name in written:
            with open(os.path.join(out, name), 'rb') as a, open(os.path.join(out2, name), 'rb') as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_malformed_results_fail_cleanly(self):
        good = os.path.join(SOURCE, 'bench', 'results', 'forest-cpu-2core-epyc.json')
        cases = {
            'truncated.json': '[{"impl": "tpp", "np": 1024',
            'cuda-x-paper.json': json.dumps([{'impl': 'tpp', 'np': 1024, 'ns': 0, 'median_us': '12', 'floor_us': 3}]),
            'e2e-x-sharing-on-np1-ns0.json': json.dumps({'normalized_latency_ms_per_token': 3.0, 'rate': 1,
                                                         'np': 1, 'ns': 0, 'nc': 2}),
            'forest-x.json': json.dumps({'benchmark': 'forest', 'insert_us': 1.0}),
            'http-streams-x.json': json.dumps({'benchmark': 'http_streams', 'levels': [{'concurrency': 1}]}),
            'fronts-x.json': json.dumps({'benchmark': 'fronts', 'runs': {'grpc': 'x'}, 'medians': {}}),
        }
        for name, text in cases.items():
            with self.subTest(name=name):
                results = tempfile.mkdtemp(prefix='results-', dir=self.tmp)
                shutil.copy(good, results)
                with open(os.path.join(results, name), 'w') as f:
                    f.write(text)
                r, written, out = self.plot(results, os.path.join(results, 'out'))
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertRegex(r.stderr, r'plot\.py: error: .*%s: ' % re.escape(name))
                # The others are still drawn.
                self.assertEqual(written, ['forest-cpu-2core-epyc-forest.png'], r.stdout)

    def test_unknown_results_are_skipped(self):
        results = os.path.join(self.tmp, 'results')
        os.makedirs(results)
        shutil.copy(os.path.join(SOURCE, 'bench', 'results', 'forest-cpu-2core-epyc.json'), results)
        write_json(results, 'other.json', {'benchmark': 'something_else', 'value': 1})
        write_json(results, 'empty.json', [])
        r, written, out = self.plot(results)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn('skip %s' % os.path.join(results, 'other.json'), r.stdout)
        self.assertIn('skip %s' % os.path.join(results, 'empty.json'), r.stdout)
        self.assertEqual(written, ['forest-cpu-2core-epyc-forest.png'])

    def test_unwritable_output_fails_cleanly(self):
        not_a_folder = os.path.join(self.tmp, 'file')
        open(not_a_folder, 'w').close()
        r, written, _ = self.plot(os.path.join(SOURCE, 'bench', 'results'), os.path.join(not_a_folder, 'out'))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn('plot.py: error: ', r.stderr)
        self.assertEqual(written, [])

    def test_missing_matplotlib_is_an_error(self):
        # A stand-in package that fails to import, ahead of the real one on the path.
        fake = os.path.join(self.tmp, 'fake', 'matplotlib')
        os.makedirs(fake)
        with open(os.path.join(fake, '__init__.py'), 'w') as f:
            f.write('raise ImportError("stand-in: no matplotlib here")\n')
        env = dict(self.env, PYTHONPATH=os.path.dirname(fake))
        r, written, _ = self.plot(os.path.join(SOURCE, 'bench', 'results'), env=env)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn('python3-matplotlib', r.stderr)
        self.assertEqual(written, [])


def main():
    global SOURCE
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--source', default=SOURCE)
    args, rest = parser.parse_known_args()
    SOURCE = os.path.abspath(args.source)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == '__main__':
    main()
