"""scripts/check_layering.py: the repository is clean, and a forbidden edge in
a small tree of the same shape is found and named."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
CHECK = os.path.join(ROOT, 'scripts', 'check_layering.py')


def run(root):
    return subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True, timeout=120)


class LayeringTest(unittest.TestCase):
    def test_repository_is_clean(self):
        r = run(ROOT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def check_tree(self, files):
        with tempfile.TemporaryDirectory(prefix='chunkattn-layering-') as root:
            for path, text in files.items():
                full = os.path.join(root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, 'w') as f:
                    f.write(text)
            return run(root)

    def test_allowed_edges_pass(self):
        r = self.check_tree({
            'engine/a.cc': '#include "services/x.h"\n#include "workers/y.h"\n',
            'services/x.h': '#include "text/t.h"\n#include "chunkattn/v1/generation.pb.h"\n#include <vector>\n',
            'workers/y.h': '#include "kernels/cpu/k.h"\n#include "plan/p.h"\n',
            'kernels/cpu/k.h': '#include "kernels/api/a.h"\n#include "base/status_macros.h"\n',
            'kernels/cuda/tests/t.cc': '#include "kernels/cpu/reference.h"\n',
        })
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_each_forbidden_edge_is_named(self):
        cases = {
            'services/coordinator/e.cc': 'workers/model/llama.h',
            'workers/server/w.cc': 'services/scheduler/scheduler.h',
            'kernels/cuda/plan.cc': 'kernels/cpu/attention.h',
            'kernels/api/c.h': 'workers/model/model.h',
            'base/flags.h': 'kernels/api/dtype.h',
            'text/tokenizer.cc': 'config/model_config.h',
            'services/cache/f.cc': 'kernels/cpu/attention.h',
            'workers/x.cc': 'engine/local_engine.h',
        }
        for path, inc in cases.items():
            with self.subTest(path=path):
                r = self.check_tree({path: f'// one line first\n#  include "{inc}"\n'})
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn(f'{path}:2: #include "{inc}"', r.stdout)


if __name__ == '__main__':
    unittest.main()
