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
            'services/offline/a.cc': '#include "services/x.h"\n#include "workers/y.h"\n',
            'services/x.h': '#include "text/t.h"\n#include "chunkattn/v1/generation.pb.h"\n#include <vector>\n',
            'workers/y.h': '#include "kernels/cpu/k.h"\n#include "proto/plan/p.h"\n',
            'kernels/cpu/k.h': '#include "kernels/api/a.h"\n#include "base/status_macros.h"\n',
            'kernels/cuda/tests/t.cc': '#include "kernels/cpu/reference.h"\n',
        })
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_each_forbidden_edge_is_named(self):
        cases = {
            'services/coordinator/e.cc': 'workers/model/llama.h',
            'workers/server/w.cc': 'services/core/scheduler.h',
            'kernels/cuda/plan.cc': 'kernels/cpu/attention.h',
            'kernels/api/c.h': 'workers/model/model.h',
            'base/flags.h': 'kernels/api/dtype.h',
            'text/tokenizer.cc': 'proto/model/model_config.h',
            'services/core/f.cc': 'kernels/cpu/attention.h',
            'workers/x.cc': 'services/offline/offline_engine.h',
            'services/core/s.cc': 'services/offline/offline_engine.h',
            'proto/model/m.cc': 'proto/plan/step_plan.h',
        }
        for path, inc in cases.items():
            with self.subTest(path=path):
                r = self.check_tree({path: f'// one line first\n#  include "{inc}"\n'})
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn(f'{path}:2: #include "{inc}"', r.stdout)

    def test_a_front_may_not_include_another(self):
        shared = '#include "services/fronts/generate_stream.h"\n#include "services/coordinator/request.h"\n'
        r = self.check_tree({
            'services/fronts/grpc/g.cc': shared + '#include "services/fronts/grpc/g.h"\n',
            'services/fronts/generate_stream.h': '#include "services/coordinator/engine.h"\n',
            'tests/fuzz/f.cc': '#include "services/fronts/grpc/g.h"\n#include "services/fronts/vllm/v.h"\n',
        })
        self.assertEqual(r.returncode, 0, r.stdout)
        cases = {
            'services/fronts/openai/o.cc': 'services/fronts/grpc/generation_service.h',
            'services/fronts/vllm/v.h': 'services/fronts/grpc/generation_service.h',
            'services/fronts/grpc/g.cc': 'services/fronts/openai/openai_protocol.h',
            'services/fronts/generate_stream.h': 'services/fronts/grpc/generation_service.h',
        }
        for path, inc in cases.items():
            with self.subTest(path=path):
                r = self.check_tree({path: f'// one line first\n#include "{inc}"\n'})
                self.assertEqual(r.returncode, 1, r.stdout)
                front = inc.split('/')[2]
                self.assertIn(f'{path}:2: #include "{inc}": ', r.stdout)
                self.assertIn(f'may not include services/fronts/{front}', r.stdout)


def dot(*edges):
    """A `cmake --graphviz` file with these (target, dependency) edges."""
    names = sorted({n for e in edges for n in e})
    lines = ['digraph "chunkattn" {']
    lines += [f'    "node{i}" [ label = "{n}", shape = octagon ];' for i, n in enumerate(names)]
    lines += [f'    "node{names.index(a)}" -> "node{names.index(b)}" [ style = dotted ] // {a} -> {b}'
              for a, b in edges]
    return '\n'.join(lines + ['}']) + '\n'


class LinkLayeringTest(unittest.TestCase):
    TREE = {
        'base/CMakeLists.txt': 'add_library(chunkattn_base INTERFACE)\n',
        'services/core/CMakeLists.txt': 'add_library(chunkattn_scheduler s.cc)\nchunkattn_test(chunkattn_s_test SOURCES t.cc)\n',
        'services/coordinator/CMakeLists.txt': 'add_library(chunkattn_coordinator e.cc)\n',
        'workers/model/CMakeLists.txt': 'add_library(chunkattn_model m.cc)\n',
        'proto/CMakeLists.txt': 'add_library(chunkattn_proto p.cc)\n',
        'services/fronts/grpc/CMakeLists.txt': 'add_library(chunkattn_front_grpc g.cc)\n',
        'services/fronts/vllm/CMakeLists.txt': 'add_library(chunkattn_front_vllm v.cc)\n',
    }

    def check(self, *edges):
        with tempfile.TemporaryDirectory(prefix='chunkattn-links-') as root:
            for path, text in self.TREE.items():
                os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
                with open(os.path.join(root, path), 'w') as f:
                    f.write(text)
            graph = os.path.join(root, 'g.dot')
            with open(graph, 'w') as f:
                f.write(dot(*edges))
            return subprocess.run([sys.executable, CHECK, root, '--graph', graph], capture_output=True, text=True,
                                  timeout=120)

    def test_repository_links_follow_the_layers(self):
        build = os.environ.get('CHUNKATTN_BUILD_DIR')
        if not build:
            self.fail('CHUNKATTN_BUILD_DIR names the configured build folder (ctest sets it)')
        r = subprocess.run([sys.executable, CHECK, ROOT, '--build', build], capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_allowed_links_pass(self):
        r = self.check(('chunkattn_coordinator', 'chunkattn_scheduler'), ('chunkattn_scheduler', 'chunkattn_base'),
                       ('chunkattn_coordinator', 'chunkattn_proto'), ('chunkattn_coordinator', 'gRPC::grpc++'),
                       ('chunkattn_s_test', 'chunkattn_model'))  # a test may link what it checks against
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_a_link_up_or_across_is_named(self):
        r = self.check(('chunkattn_coordinator', 'chunkattn_model'))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn('link chunkattn_coordinator -> chunkattn_model: services may not link workers', r.stdout)

    def test_a_front_may_not_link_another(self):
        r = self.check(('chunkattn_front_vllm', 'chunkattn_coordinator'), ('chunkattn_front_vllm', 'chunkattn_front_grpc'))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn('link chunkattn_front_vllm -> chunkattn_front_grpc: services/fronts/vllm may not link '
                      'services/fronts/grpc', r.stdout)

    def test_the_core_may_not_reach_the_wire_by_any_chain(self):
        # The scheduler includes no protobuf; linking it through another
        # target still drags gRPC into every user.
        r = self.check(('chunkattn_scheduler', 'chunkattn_base'), ('chunkattn_base', 'absl::status'),
                       ('chunkattn_scheduler', 'chunkattn_coordinator'), ('chunkattn_coordinator', 'gRPC::grpc++'))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn('chunkattn_scheduler -> chunkattn_coordinator -> gRPC::grpc++', r.stdout)


if __name__ == '__main__':
    unittest.main()
