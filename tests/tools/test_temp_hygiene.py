"""Tests leave no temporary files behind, passed or failed.

Each case runs code that makes temporary folders (the services harness and the
tests built on it, the scripts that tests run, the model tests' reference
fixtures) with TMPDIR pointed at a fresh empty folder, and checks that the
folder is empty again once the code is done: after a passing run, after a test
body or a setUpClass that fails midway, and after a SIGTERM. Each case also
checks that something was really made in that folder, so an empty folder
proves a cleanup, not a path that went elsewhere.

Nothing here needs the network or a real build: servers and binaries are small
stand-ins (a real test binary is used where --build has it).

Usage: test_temp_hygiene.py [--build DIR] [--source DIR] [unittest args]
"""
import argparse
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest

SOURCE = BUILD = None
PYTHON = '/usr/bin/python3' if os.access('/usr/bin/python3', os.X_OK) else sys.executable


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, mode)


def leftovers(root):
    """Every path under root, relative, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


class Watched:
    """A child process run with TMPDIR=<a fresh empty folder>; notes every
    name that appears at the top of that folder while it runs."""

    def __init__(self, tmpdir, argv, env=None, cwd=None):
        self.tmpdir = tmpdir
        self.seen = set()
        self.output = ''
        self._done = threading.Event()
        env = dict(os.environ if env is None else env, TMPDIR=tmpdir, PYTHONDONTWRITEBYTECODE='1')
        # Output to a file (beside, not in, the watched folder), not a pipe: a
        # straggler holding a pipe would keep us waiting.
        self._log = open(tmpdir + '.log', 'w+b')
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self):
        while not self._done.is_set():
            try:
                self.seen.update(os.listdir(self.tmpdir))
            except OSError:
                pass
            time.sleep(0.005)

    def wait(self, timeout):
        timed_out = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        self._done.set()
        self._poller.join()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers, if any
        except OSError:
            pass
        self.proc.wait()
        self._log.seek(0)
        self.output = self._log.read().decode(errors='replace')
        self._log.close()
        if timed_out:
            raise AssertionError('timed out after %d s:\n%s' % (timeout, self.output[-3000:]))
        return self.proc.returncode


class HygieneTestCase(unittest.TestCase):
    def setUp(self):
        # Outside the watched folder: the stand-ins and what must survive ($OUT).
        self.private = tempfile.mkdtemp(prefix='chunkattn-hygiene-')
        self.addCleanup(subprocess.run, ['rm', '-rf', self.private])
        self.fake_build = os.path.join(self.private, 'build')
        for name in ('chunkattn-worker', 'chunkattn-coordinator'):
            # Exits at once: a cluster on them fails to start, a flag check fails.
            write(os.path.join(self.fake_build, 'bin', name), '#!/bin/sh\nexit 1\n', 0o755)
        write(os.path.join(self.fake_build, 'demo-model', 'config.json'), '{}\n')

    def watched_dir(self):
        d = tempfile.mkdtemp(dir=self.private, prefix='tmpdir-')
        return d

    def run_watched(self, argv, timeout=120, env=None, cwd=None, expect_rc=None):
        tmpdir = self.watched_dir()
        w = Watched(tmpdir, argv, env=env, cwd=cwd)
        rc = w.wait(timeout)
        if expect_rc is not None:
            self.assertEqual(rc, expect_rc, w.output[-3000:])
        return w, tmpdir

    def assert_clean(self, tmpdir, w, made=()):
        """Nothing is left in tmpdir, and each prefix in `made` was seen there."""
        for prefix in made:
            self.assertTrue(any(n.startswith(prefix) for n in w.seen),
                            'nothing named %s* was made in TMPDIR (seen: %s): the case proves nothing\n%s'
                            % (prefix, sorted(w.seen), w.output[-3000:]))
        self.assertEqual(leftovers(tmpdir), [], 'left in TMPDIR:\n' + w.output[-3000:])

    def harness_test(self, path, *args):
        return [PYTHON, os.path.join(SOURCE, path), '--build', self.fake_build, '--source', SOURCE] + list(args)


# A harness-based test module of its own: folders made through temp_dir() with
# a test's or a class's cleanup, a folder left to the exit-time cleanup (as
# test_security.make_pki does), a server process and its log; every test fails.
HARNESS_SCRIPT = r'''
import os, sys, time, unittest
sys.path.insert(0, os.path.join(os.environ['HYGIENE_SOURCE'], 'tests', 'services'))
import harness

REPORT = os.environ['HYGIENE_REPORT']


def note(*words):
    with open(REPORT, 'a') as f:
        f.write(' '.join(str(w) for w in words) + '\n')


class ClassSetupFails(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        note('dir', harness.temp_dir('chunkattn-hygiene-class-', cls.addClassCleanup))
        raise RuntimeError('setUpClass fails after making its folder')

    def test_never_runs(self):
        pass


class BodyFails(unittest.TestCase):
    def test_fails_midway(self):
        d = harness.temp_dir('chunkattn-hygiene-test-', self.addCleanup)
        note('dir', d)
        with open(os.path.join(d, 'file'), 'w') as f:
            f.write('x')
        p = harness.Process('hygiene-sleeper', ['sleep', '60']).start()
        note('pid', p.proc.pid)
        note('dir', harness.log_dir())
        self.fail('the test body fails after making its folder and starting a process')

    def test_folder_left_for_exit(self):
        import test_security  # make_pki: folder only on harness._temp_dirs
        folder, _ = test_security.make_pki()
        note('dir', folder)
        raise RuntimeError('fails with the PKI folder made')


class KilledMidway(unittest.TestCase):
    def test_sigterm(self):
        note('dir', harness.temp_dir('chunkattn-hygiene-term-', self.addCleanup))
        p = harness.Process('hygiene-sleeper', ['sleep', '60']).start()
        note('pid', p.proc.pid)
        note('ready')
        time.sleep(60)


if __name__ == '__main__':
    harness.main()
'''


class HarnessTest(HygieneTestCase):
    """tests/services/harness.py: temp_dir(), the logs and the stubs."""

    def script(self):
        path = os.path.join(self.private, 'hygiene_script.py')
        write(path, HARNESS_SCRIPT)
        report = os.path.join(self.private, 'report.txt')
        env = dict(os.environ, HYGIENE_SOURCE=SOURCE, HYGIENE_REPORT=report)
        env.pop('CHUNKATTN_KEEP_TEST_LOGS', None)
        return path, report, env

    @staticmethod
    def notes_ready(report):
        if not os.path.exists(report):
            return False
        with open(report) as f:
            return 'ready\n' in f.readlines()

    @staticmethod
    def notes(report, kind):
        with open(report) as f:
            return [line.split(' ', 1)[1].strip() for line in f if line.startswith(kind + ' ')]

    def assert_gone(self, pids):
        for pid in pids:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                continue
            # A zombie is gone for our purposes; a live process is not.
            with open('/proc/%s/stat' % pid) as f:
                self.assertEqual(f.read().split(') ')[-1][0], 'Z', 'process %s outlived its test' % pid)

    def test_failing_tests_and_setup_leave_nothing(self):
        path, report, env = self.script()
        w, tmpdir = self.run_watched(
            self.harness_test(path, 'ClassSetupFails', 'BodyFails.test_fails_midway',
                              'BodyFails.test_folder_left_for_exit'), env=env, expect_rc=1)
        self.assertIn('FAILED', w.output)
        # The class's folder lives for milliseconds: the script's own notes say
        # where each folder was made.
        dirs = self.notes(report, 'dir')
        self.assertEqual(len(dirs), 4, w.output[-3000:])
        for d in dirs:
            self.assertEqual(os.path.dirname(d), tmpdir, d)
        self.assert_clean(tmpdir, w, made=('chunkattn-pki-', 'chunkattn-services-', 'chunkattn-stubs-'))
        self.assert_gone(self.notes(report, 'pid'))

    def test_sigterm_midway_leaves_nothing(self):
        path, report, env = self.script()
        tmpdir = self.watched_dir()
        w = Watched(tmpdir, self.harness_test(path, 'KilledMidway'), env=env)
        deadline = time.monotonic() + 60
        while not self.notes_ready(report):
            self.assertIsNone(w.proc.poll(), 'the script ended before it was ready')
            self.assertLess(time.monotonic(), deadline, 'the script never got ready')
            time.sleep(0.05)
        os.kill(w.proc.pid, signal.SIGTERM)
        self.assertEqual(w.wait(30), 128 + signal.SIGTERM, w.output[-3000:])
        self.assert_clean(tmpdir, w, made=('chunkattn-hygiene-term-', 'chunkattn-services-',
                                           'chunkattn-stubs-'))
        self.assert_gone(self.notes(report, 'pid'))


class DeployTestsTest(HygieneTestCase):
    """The known offenders among the deployment tests."""

    def test_image_bundle_removed_when_setup_fails(self):
        # bundle.sh fails midway (the stand-in build lacks bin/chunkattn),
        # after filling part of the class's folder.
        w, tmpdir = self.run_watched(self.harness_test('tests/deploy/test_images.py', 'BundleTest'),
                                     expect_rc=1)
        self.assertIn('bundle.sh failed', w.output)
        self.assert_clean(tmpdir, w, made=('chunkattn-bundle-', 'chunkattn-stubs-'))

    def test_chart_notes_copy_removed(self):
        tools = os.environ.get('CHUNKATTN_TOOLS', os.path.expanduser('~/.cache/chunkattn/tools'))
        if not os.access(os.path.join(tools, 'helm', 'helm'), os.X_OK):
            self.skipTest('helm is not installed (scripts/install-helm.sh); not fetched here')
        w, tmpdir = self.run_watched(self.harness_test(
            'tests/deploy/test_chart.py', 'LintAndTemplateTest.test_notes_tell_how_to_call_generate'),
            expect_rc=0)
        self.assert_clean(tmpdir, w, made=('chunkattn-notes-',))


class ScriptsTest(HygieneTestCase):
    """Shell scripts the tests run: their mktemp folders go on failure and on
    SIGTERM (sh runs its EXIT trap on a signal only through a trapped exit)."""

    def recorder(self, name, then):
        """A stand-in binary that appends its argv to a file, then runs `then`."""
        record = os.path.join(self.private, name + '.argv')
        path = os.path.join(self.private, 'bin', name)
        write(path, '#!/bin/sh\necho "$*" >> %s\n%s\n' % (record, then), 0o755)
        return path, record

    @staticmethod
    def recorded(record):
        try:
            with open(record) as f:
                return f.read().endswith('\n')
        except FileNotFoundError:
            return False

    def assert_made_inside(self, record, tmpdir):
        with open(record) as f:
            self.assertIn(tmpdir + '/', f.read(), 'the script made nothing in TMPDIR')

    def killed_midway(self, argv, record, tmpdir):
        """Runs argv until the stand-in has started, then SIGTERMs the process
        group (as an interrupted ctest or a Ctrl-C does)."""
        w = Watched(tmpdir, argv)
        deadline = time.monotonic() + 60
        # The record's whole line, not its existence: `>>` creates the file
        # before echo writes, and a kill in between left it empty (seen in CI).
        while not self.recorded(record):
            self.assertIsNone(w.proc.poll(), 'ended before the stand-in started')
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        os.killpg(w.proc.pid, signal.SIGTERM)
        w.wait(30)
        return w

    def test_tp_gloo_check(self):
        script = os.path.join(SOURCE, 'tests', 'tools', 'tp_gloo_check.sh')
        fails, record = self.recorder('generate-fails', 'exit 1')
        w, tmpdir = self.run_watched(['sh', script, fails, SOURCE])
        self.assertNotEqual(w.proc.returncode, 0)
        self.assert_made_inside(record, tmpdir)
        self.assert_clean(tmpdir, w, made=('chunkattn-tp-',))

        hangs, record = self.recorder('generate-hangs', 'exec sleep 60')
        tmpdir = self.watched_dir()
        w = self.killed_midway(['sh', script, hangs, SOURCE], record, tmpdir)
        self.assert_made_inside(record, tmpdir)
        self.assert_clean(tmpdir, w, made=('chunkattn-tp-',))

    def test_gloo_check_runner(self):
        script = os.path.join(SOURCE, 'workers', 'collectives', 'run_gloo_check.sh')
        fails, record = self.recorder('gloo-fails', 'exit 1')
        w, tmpdir = self.run_watched(['sh', script, fails, '2'], expect_rc=1)
        self.assert_made_inside(record, tmpdir)
        self.assert_clean(tmpdir, w)

        hangs, record = self.recorder('gloo-hangs', 'exec sleep 60')
        tmpdir = self.watched_dir()
        w = self.killed_midway(['sh', script, hangs, '2'], record, tmpdir)
        self.assert_made_inside(record, tmpdir)
        self.assert_clean(tmpdir, w)

    def test_cuda_session_call(self):
        # A stand-in bundle: env.sh and one "test binary" that records where it runs.
        record = os.path.join(self.private, 'cuda-test.argv')
        staged = os.path.join(self.private, 'staged', 'gpu-bundle')
        write(os.path.join(staged, 'env.sh'), 'here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\n'
              'export LD_LIBRARY_PATH="$here/lib"\n')
        write(os.path.join(staged, 'bin', 'chunkattn_kernels_cuda_test'),
              '#!/bin/sh\necho "$0 $*" >> %s\nexit 1\n' % record, 0o755)
        os.makedirs(os.path.join(staged, 'lib'))
        bundle = os.path.join(self.private, 'gpu-bundle.tar.xz')
        with tarfile.open(bundle, 'w:xz') as t:
            t.add(staged, arcname='gpu-bundle')
        out = os.path.join(self.private, 'out')
        env = dict(os.environ, CHUNKATTN_BUNDLE=bundle, CHUNKATTN_SESSION_NO_GPU='1',
                   CHUNKATTN_SESSION_STEP_CAP_S='2')
        w, tmpdir = self.run_watched([os.path.join(SOURCE, 'scripts', 'cuda_session.sh'), 'tests', out],
                                     env=env, cwd=self.private, expect_rc=1)
        self.assertEqual(sorted(os.listdir(out)), ['tests-summary.txt', 'tests.tar.gz'], w.output[-3000:])
        self.assert_made_inside(record, tmpdir)
        self.assert_clean(tmpdir, w, made=('chunkattn-session', 'chunkattn-bundle'))

        w, tmpdir = self.run_watched([os.path.join(SOURCE, 'scripts', 'cuda_session.sh'), 'collect', out],
                                     expect_rc=0)
        self.assertIn('| kernels-cuda-test', w.output)
        self.assert_clean(tmpdir, w)


class ModelTestBinaryTest(HygieneTestCase):
    """The model tests' reference fixtures (chunkattn-ref-*) and the loader
    tests' folders (chunkattn-loader-*): one process per test under ctest."""

    def test_reference_and_loader_folders_removed_at_exit(self):
        binary = os.path.join(BUILD, 'bin', 'chunkattn_model_test')
        if not os.access(binary, os.X_OK):
            self.skipTest('no %s' % binary)
        # References() (the NumPy fixtures, kept until exit) and Resave() (loader folders).
        w, tmpdir = self.run_watched([binary, '--gtest_filter=WeightsTest.ErrorsNameTheFileAndTensor'],
                                     expect_rc=0)
        self.assertIn('[  PASSED  ] 1 test', w.output)
        # The loader's folders live for milliseconds: the poll may miss them; the
        # fixtures' live until exit.
        self.assert_clean(tmpdir, w, made=('chunkattn-ref-',))


def main():
    global SOURCE, BUILD
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--source', required=True)
    parser.add_argument('--build', required=True)
    args, rest = parser.parse_known_args()
    SOURCE, BUILD = os.path.abspath(args.source), os.path.abspath(args.build)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == '__main__':
    main()
