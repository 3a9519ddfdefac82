"""The tree as docs/architecture.md draws it: the design card's folders are
the spine, beside them only libraries and support whose names explain
themselves; no source file grows past 1,500 lines (split it by stage)."""
import os
import subprocess
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
SPINE = {'proto', 'services', 'workers', 'kernels', 'deploy', 'tests'}
SUPPORT = {'base', 'text', 'bench', 'scripts', 'docs', 'data', 'cmake'}
SOURCE = ('.h', '.cc', '.cu', '.cuh', '.py', '.sh')
MAX_LINES = 1500


def tracked(root):
    out = subprocess.run(['git', 'ls-files'], cwd=root, capture_output=True, text=True, check=True, timeout=60)
    return [p for p in out.stdout.splitlines() if os.path.exists(os.path.join(root, p))]


class TreeTest(unittest.TestCase):
    def test_top_level_folders_are_the_spine_and_support(self):
        folders = {p.split('/')[0] for p in tracked(ROOT) if '/' in p and not p.startswith('.')}
        self.assertEqual(folders - SPINE - SUPPORT, set(), 'a top-level folder the design does not draw')
        self.assertEqual(SPINE - folders, set(), 'a spine folder is missing')

    def test_no_source_file_is_over_the_limit(self):
        long = []
        for path in tracked(ROOT):
            if not path.endswith(SOURCE) or path.startswith(('tests/fixtures/', 'bench/results/')):
                continue
            with open(os.path.join(ROOT, path), 'rb') as f:
                lines = f.read().count(b'\n')
            if lines > MAX_LINES:
                long.append(f'{path}: {lines} lines')
        self.assertEqual(long, [], f'split these by stage (at most {MAX_LINES} lines)')


if __name__ == '__main__':
    unittest.main()
