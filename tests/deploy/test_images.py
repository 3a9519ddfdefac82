"""The container images, as far as they can be checked without a Docker
engine: scripts/bundle.sh (what the runtime stages copy) makes a
self-contained tree that runs, and the Dockerfiles agree with the build
scripts, the bundle and the Helm chart (entrypoints, user, ports, flags).

Run: /usr/bin/python3 tests/deploy/test_images.py --build build [TestClass]
"""
import os
import re
import shlex
import subprocess
import sys
import unittest

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'services'))
import harness  # noqa: E402
from test_chart import binary_flags, parse_args  # noqa: E402

PREFIX = '/opt/chunkattn'
RUNTIME_LIBS = re.compile(r'^(ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|'
                          r'libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia-|linux-vdso)')
DOCKERFILES = {'coordinator': 'coordinator.Dockerfile', 'worker': 'worker.Dockerfile'}


def dockerfile(component):
    """[(instruction, argument text)] with continuation lines joined."""
    with open(os.path.join(harness.SOURCE, 'deploy', 'docker', DOCKERFILES[component])) as f:
        text = re.sub(r'\\\n', ' ', f.read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith('#'):
            word, _, rest = line.partition(' ')
            out.append((word.upper(), rest.strip()))
    return out


def exec_form(rest):
    """["a", "b"] -> ['a', 'b'] (the JSON form of ENTRYPOINT / CMD)."""
    return yaml.safe_load(rest)


class BundleTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # About 900 MB: removed after the class, also when setUpClass fails.
        cls.tmp = harness.temp_dir('chunkattn-bundle-', cls.addClassCleanup)
        cls.prefix = os.path.join(cls.tmp, 'opt')
        r = subprocess.run([os.path.join(harness.SOURCE, 'scripts', 'bundle.sh'), cls.prefix],
                           env=dict(os.environ, BUILD_DIR=harness.BUILD), capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError('bundle.sh failed:\n' + r.stdout + r.stderr)
        cls.env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(cls.prefix, 'lib'))
        cls.env.pop('CHUNKATTN_SPM_MODULE', None)

    def test_every_library_resolves_inside_the_bundle(self):
        lib = os.path.join(self.prefix, 'lib')
        files = [os.path.join(self.prefix, 'bin', b) for b in os.listdir(os.path.join(self.prefix, 'bin'))]
        files.append(os.path.join(lib, 'libchunkattn_spm.so'))
        self.assertEqual(len(files), 5)
        for f in files:
            out = subprocess.run(['ldd', f], env=self.env, capture_output=True, text=True, timeout=30).stdout
            for line in out.splitlines():
                parts = line.split()
                if not parts or RUNTIME_LIBS.match(parts[0]) or parts[0].startswith('/'):
                    continue
                self.assertNotIn('not found', line, f)
                self.assertEqual(len(parts) >= 3 and parts[1], '=>', line)
                self.assertTrue(parts[2].startswith(lib + '/'), '%s loads %s from outside the bundle' %
                                (os.path.basename(f), parts[2]))

    def test_bundled_binaries_run_the_demo_model(self):
        model = os.path.join(self.prefix, 'models', 'demo')
        self.assertTrue(os.path.isfile(os.path.join(model, 'config.json')))
        r = subprocess.run([os.path.join(self.prefix, 'bin', 'chunkattn-generate'), '--model', model,
                            '--system_prompt', 'You are a helpful assistant.',
                            '--prompts_file', os.path.join(harness.SOURCE, 'data', 'demo', 'prompts.txt'),
                            '--max_new_tokens', '4', '--temperature', '0'],
                           env=self.env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Text prompts: the SentencePiece module was found next to the binaries.
        self.assertRegex(r.stdout + r.stderr, r'requests 8, prompt tokens \d+')
        for b in ('chunkattn-coordinator', 'chunkattn-worker', 'chunkattn'):
            r = subprocess.run([os.path.join(self.prefix, 'bin', b), '--help'], env=self.env,
                               capture_output=True, text=True, timeout=30)
            self.assertIn('chunkattn', r.stdout + r.stderr, b)


class DockerfileTest(unittest.TestCase):
    """Each Dockerfile builds with the CI scripts and matches the chart."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(harness.SOURCE, 'deploy', 'helm', 'chunkattn', 'values.yaml')) as f:
            cls.values = yaml.safe_load(f)

    def test_builds_with_the_ci_scripts(self):
        for component in DOCKERFILES:
            steps = dockerfile(component)
            froms = [rest for word, rest in steps if word == 'FROM']
            self.assertEqual(len(froms), 2, '%s: a build stage and a runtime stage' % component)
            runs = ' '.join(rest for word, rest in steps if word == 'RUN')
            for script in ('scripts/install-deps.sh', 'scripts/build.sh', 'scripts/bundle.sh %s' % PREFIX):
                self.assertIn(script, runs, component)
            for script in re.findall(r'scripts/[\w.-]+', runs):
                self.assertTrue(os.access(os.path.join(harness.SOURCE, script), os.X_OK), script)
            copies = [rest for word, rest in steps if word == 'COPY' and '--from=build' in rest]
            self.assertEqual(copies, ['--from=build %s %s' % (PREFIX, PREFIX)], component)
            env = ' '.join(rest for word, rest in steps if word == 'ENV')
            self.assertIn('LD_LIBRARY_PATH=%s/lib' % PREFIX, env)
        worker_runs = ' '.join(rest for word, rest in dockerfile('worker') if word == 'RUN')
        self.assertIn('-DCHUNKATTN_CUDA=ON', worker_runs)
        self.assertIn('nvidia/cuda', ' '.join(rest for word, rest in dockerfile('worker') if word == 'FROM'))

    def test_matches_the_chart(self):
        security = self.values['podSecurityContext']
        expected_ports = {
            'coordinator': {self.values['coordinator'][k] for k in ('grpcPort', 'metricsPort', 'healthPort')} |
                           {self.values['http']['port']},
            'worker': {self.values['worker'][k] for k in ('port', 'healthPort')},
        }
        for component in DOCKERFILES:
            steps = dockerfile(component)
            user = [rest for word, rest in steps if word == 'USER'][-1]
            self.assertEqual(user, '%d:%d' % (security['runAsUser'], security['runAsGroup']), component)
            exposed = {int(p) for word, rest in steps if word == 'EXPOSE' for p in rest.split()}
            self.assertEqual(exposed, expected_ports[component], component)
            entrypoint = exec_form([rest for word, rest in steps if word == 'ENTRYPOINT'][-1])
            binary = 'chunkattn-%s' % component
            self.assertEqual(entrypoint, ['%s/bin/%s' % (PREFIX, binary)])
            # The chart runs the same path (both pod templates, for every layout,
            # are in _pods.tpl), and the image's default flags exist.
            template = os.path.join(harness.SOURCE, 'deploy', 'helm', 'chunkattn', 'templates', '_pods.tpl')
            with open(template) as f:
                self.assertIn('command: ["%s/bin/%s"]' % (PREFIX, binary), f.read())
            cmd = exec_form([rest for word, rest in steps if word == 'CMD'][-1])
            self.assertLessEqual(set(parse_args(cmd)), binary_flags(binary), component)

    def test_dockerignore_keeps_builds_out(self):
        with open(os.path.join(harness.SOURCE, '.dockerignore')) as f:
            ignored = {shlex.split(l)[0] for l in f if l.strip() and not l.startswith('#')}
        self.assertIn('build/', ignored)
        self.assertIn('.git/', ignored)


if __name__ == '__main__':
    harness.main()
