"""The GPU session's plumbing, proven without a GPU (scripts/cuda_session.sh).

Builds the bundle from this build's binaries and checks what the device tool
needs of it (packed under 60 MiB, every bundled binary's libraries inside the
bundle but the GPU host's own cuBLAS, NCCL and driver); then runs every device
call in the mode where no GPU is expected, each with its own $OUT as the device
tool gives it, and checks what comes back: at most 8 files, the call's archive
with a per-step status table listing the call's steps in order, each step's
log, and that a step that failed or timed out did not stop the next.

Usage: test_cuda_session.py --build DIR --source DIR
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

BUILD = SOURCE = None

# The steps of each call, in order (what bench/README.md's call table promises).
CALLS = {
    "tests": ["bundle", "gpu-info", "fixtures", "kernels-cuda-test", "model-cuda-test", "memcheck"],
    "kernels": ["bundle", "paper-fp16", "gqa", "torch-baseline"],
    "e2e": ["bundle", "ready-on", "info", "on-np2048-ns2048", "on-np4096-ns4096", "ready-off",
            "off-np2048-ns2048", "off-np4096-ns4096"],
}

# Libraries the bundle leaves to the GPU host (glibc's, the driver's, cuBLAS, NCCL).
HOST_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|"
                       r"libresolv\.so|libcuda\.so|libnvidia|libcublas|libcublasLt|libnccl)")
DEVICE_TOOL_MAX_FILES = 8
SESSION_LIMIT_S = 11 * 60  # every call's steps together: 15 minutes of device time, a start and packing besides
DEVICE_COMMAND_S = 10 * 60
STEP_CAP_S = 5         # each step, in the no-GPU mode
ROW = re.compile(r"^\| (\S+)\s+\| (\S+)\s+\|\s+(\d+) \|\s+(\d+) \|\s+(\d+) \|$")


def free_port_pair():
    """A port p with p + 1 also free on 127.0.0.1 (the coordinator's and the worker's)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two adjacent free ports")


def parse_summary(text):
    """[(step, status, rc, seconds, limit_s)] from a summary table."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m and m.group(1) != "step":
            rows.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return rows


class GpuSessionPlumbingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="chunkattn-session-test-")
        # A class cleanup also runs when setUpClass fails (tearDownClass does not).
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        cls.bundle = os.path.join(cls.tmp, "gpu-bundle.tar.xz")
        # xz's fastest level on every core: the session's default (-6, one
        # thread) took 60 of this test's 90 s on 2 cores. Its archive is larger
        # (21 vs 15 MiB), so the size check below is stricter than the real one.
        env = dict(os.environ, BUILD_DIR=BUILD, CHUNKATTN_BUNDLE=cls.bundle, XZ_OPT="-1 -T0")
        r = subprocess.run([os.path.join(SOURCE, "scripts", "cuda_session.sh"), "bundle"], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"bundle failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        cls.bundle_log = r.stdout
        cls.calls = {}

    def test_bundle_travels_and_resolves(self):
        self.assertLess(os.path.getsize(self.bundle), 60 << 20)
        with open(self.bundle[:-len(".tar.xz")] + ".commit") as f:
            commit = f.read().strip()
        head = subprocess.run(["git", "-C", SOURCE, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        self.assertTrue(commit.startswith(head.strip()), (commit, head))

        unpacked = os.path.join(self.tmp, "unpacked")
        os.makedirs(unpacked)
        with tarfile.open(self.bundle) as t:
            t.extractall(unpacked)
        root = os.path.join(unpacked, "gpu-bundle")
        lib = os.path.join(root, "lib")
        bins = sorted(os.listdir(os.path.join(root, "bin")))
        self.assertEqual(len(bins), 7, bins)
        for b in bins:
            r = subprocess.run(["ldd", os.path.join(root, "bin", b)], env=dict(os.environ, LD_LIBRARY_PATH=lib),
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            for line in r.stdout.splitlines():
                parts = line.split()
                if not parts or HOST_LIBS.match(parts[0]) or parts[0].startswith("/"):
                    continue
                self.assertNotIn("not found", line, f"{b}: {line}")
                if "=>" in parts:
                    path = parts[parts.index("=>") + 1]
                    self.assertTrue(path.startswith(lib + "/"), f"{b}: {parts[0]} resolves outside the bundle: {path}")

    def call_once(self, call):
        """run_call(call), once per class: the tests read the same results."""
        if call not in self.calls:
            self.calls[call] = self.run_call(call)
        return self.calls[call]

    def run_call(self, call):
        out = tempfile.mkdtemp(prefix="out-" + call + "-", dir=self.tmp)
        env = dict(os.environ, TMPDIR=self.tmp, CHUNKATTN_BUNDLE=self.bundle, CHUNKATTN_SESSION_NO_GPU="1",
                   CHUNKATTN_SESSION_STEP_CAP_S=str(STEP_CAP_S), CHUNKATTN_E2E_PORT=str(free_port_pair()))
        r = subprocess.run([os.path.join(SOURCE, "scripts", "cuda_session.sh"), call, out], env=env, cwd=SOURCE,
                           capture_output=True, text=True, timeout=DEVICE_COMMAND_S)
        return r, out

    def test_the_plan_fits_the_device_time(self):
        """Three calls whose limits add to 11 minutes; the header's pasted timeouts cover them."""
        self.assertLessEqual(len(CALLS), 3)
        limits = {}
        for call in CALLS:
            _, out = self.call_once(call)
            with open(os.path.join(out, call + "-summary.txt")) as f:
                limits[call] = sum(row[4] for row in parse_summary(f.read()))
        self.assertLessEqual(sum(limits.values()), SESSION_LIMIT_S, limits)
        with open(os.path.join(SOURCE, "scripts", "cuda_session.sh")) as f:
            header = f.read()
        for n, call in enumerate(CALLS, 1):
            m = re.search(rf'#\s+{n}\. command "scripts/cuda_session.sh {call} \$OUT"\s+timeout_s (\d+)', header)
            self.assertIsNotNone(m, f"the header gives no pasted call {n} for {call}")
            timeout = int(m.group(1))
            self.assertGreater(timeout, limits[call], call)
            self.assertLessEqual(timeout, DEVICE_COMMAND_S, call)
            self.assertTrue(f"(limits {limits[call]} s)" in header, f"the header misstates {call}'s limits")

    def test_a_call_cut_off_returns_what_it_finished(self):
        """Results are written after every step: SIGKILL mid-call, the archive holds the steps done."""
        out = tempfile.mkdtemp(prefix="out-cut-", dir=self.tmp)
        env = dict(os.environ, TMPDIR=self.tmp, CHUNKATTN_BUNDLE=self.bundle, CHUNKATTN_SESSION_NO_GPU="1",
                   CHUNKATTN_SESSION_STEP_CAP_S="3")
        p = subprocess.Popen([os.path.join(SOURCE, "scripts", "cuda_session.sh"), "tests", out], env=env,
                             cwd=SOURCE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        summary = os.path.join(out, "tests-summary.txt")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if os.path.exists(summary):
                    with open(summary) as f:
                        if len(parse_summary(f.read())) >= 3:
                            break
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGKILL)
        finally:
            p.wait(timeout=30)
        with open(summary) as f:
            rows = parse_summary(f.read())
        self.assertGreaterEqual(len(rows), 3)
        self.assertLess(len(rows), len(CALLS["tests"]), "the call finished before the kill: nothing was cut")
        with tarfile.open(os.path.join(out, "tests.tar.gz")) as t:
            names = set(n.lstrip("./") for n in t.getnames())
            archived = parse_summary(t.extractfile("./summary.txt").read().decode())
        self.assertGreaterEqual(len(archived), 3)
        self.assertEqual([r[0] for r in archived], CALLS["tests"][:len(archived)])
        for name, *_ in archived:
            self.assertIn(f"logs/{name}.log", names)

    def test_every_call_returns_its_table_and_logs(self):
        for call, steps in CALLS.items():
            with self.subTest(call=call):
                r, out = self.call_once(call)
                # Without a GPU some steps fail: the call says so, after running them all.
                self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr[-2000:])
                files = sorted(os.listdir(out))
                self.assertLessEqual(len(files), DEVICE_TOOL_MAX_FILES)
                self.assertEqual(files, [call + "-summary.txt", call + ".tar.gz"])
                with open(os.path.join(out, call + "-summary.txt")) as f:
                    summary = f.read()
                with tarfile.open(os.path.join(out, call + ".tar.gz")) as t:
                    names = set(n.lstrip("./") for n in t.getnames())
                    self.assertEqual(t.extractfile("./summary.txt").read().decode(), summary)
                rows = parse_summary(summary)
                self.assertEqual([row[0] for row in rows], steps, summary)
                for name, status, rc, seconds, limit in rows:
                    self.assertIn(f"logs/{name}.log", names)
                    self.assertIn(status, ("ok", "failed", "timeout"))
                    self.assertEqual(status == "ok", rc == 0, (name, status, rc))
                    self.assertEqual(status == "timeout", rc in (124, 137), (name, status, rc))
                    # The cap (not on the bundle's unpacking: its own limit) and timeout's kill grace.
                    self.assertLessEqual(seconds, (limit if name == "bundle" else STEP_CAP_S) + 6, name)
                # The step limits of one call fit one device command (10 minutes) with room.
                self.assertLess(sum(row[4] for row in rows), DEVICE_COMMAND_S, summary)
                self.assertEqual(rows[0][1], "ok", "the bundle did not unpack")
                statuses = [row[1] for row in rows]
                bad = [i for i, s in enumerate(statuses) if s != "ok"]
                self.assertTrue(bad, "no step failed without a GPU: the mode runs nothing real")
                self.assertLess(bad[0], len(rows) - 1, "the first failure was the last step: nothing shows it went on")
                self.assertIn(f"{len(bad)} step(s) did not pass", summary)
                if call == "tests":
                    # The CUDA tests skip without a GPU and pass; their XML comes back.
                    self.assertEqual(dict((row[0], row[1]) for row in rows)["kernels-cuda-test"], "ok")
                    self.assertIn("results/kernels-cuda-test.xml", names)
                if call == "e2e":
                    # No worker can start: the waits fail, the loads time out, and each still runs.
                    self.assertIn("timeout", statuses)
                    for sharing in ("on", "off"):
                        self.assertIn(f"logs/worker-{sharing}.log", names)
                        self.assertIn(f"logs/coordinator-{sharing}.log", names)

    def test_collect_puts_results_in_place(self):
        r, out = self.call_once("tests")
        self.assertEqual(r.returncode, 1)
        # collect writes into the source tree: run it on a copy of what it touches.
        tree = os.path.join(self.tmp, "tree")
        os.makedirs(os.path.join(tree, "scripts"))
        os.makedirs(os.path.join(tree, "bench", "results"))
        shutil.copy(os.path.join(SOURCE, "scripts", "cuda_session.sh"), os.path.join(tree, "scripts"))
        # A result file and fixtures as a GPU call would return them.
        staged = os.path.join(self.tmp, "staged")
        os.makedirs(os.path.join(staged, "results"))
        os.makedirs(os.path.join(staged, "fixtures", "transformers", "llama_mha"))
        with open(os.path.join(staged, "results", "cuda-x-paper-fp16.json"), "w") as f:
            f.write("[]\n")
        with open(os.path.join(staged, "fixtures", "transformers", "llama_mha", "reference.json"), "w") as f:
            f.write("{}\n")
        shutil.copy(os.path.join(out, "tests-summary.txt"), os.path.join(staged, "summary.txt"))
        back = os.path.join(self.tmp, "back")
        os.makedirs(back)
        with tarfile.open(os.path.join(back, "model.tar.gz"), "w:gz") as t:
            t.add(staged, arcname=".")
        c = subprocess.run([os.path.join(tree, "scripts", "cuda_session.sh"), "collect", back],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(c.returncode, 0, c.stderr)
        self.assertIn("| kernels-cuda-test", c.stdout)
        self.assertTrue(os.path.exists(os.path.join(tree, "bench", "results", "cuda-x-paper-fp16.json")))
        self.assertTrue(os.path.exists(
            os.path.join(tree, "tests", "fixtures", "transformers", "llama_mha", "reference.json")))
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        c = subprocess.run([os.path.join(tree, "scripts", "cuda_session.sh"), "collect", empty],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(c.returncode, 0)


class ReferenceGeneratorEnvTest(unittest.TestCase):
    """The model tests' fixture generator runs as the GPU session sets it up.

    On the GPU host the source tree is elsewhere than where the tests were
    built, numpy lives in the image's python3, and the bundle's LD_LIBRARY_PATH
    must not reach that python3: CHUNKATTN_SOURCE_DIR and CHUNKATTN_PYTHON
    choose, and the child runs without the library path.
    """

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="chunkattn-refenv-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.source = os.path.join(self.tmp, "moved source")  # a space: the path is quoted
        os.makedirs(os.path.join(self.source, "tests", "tools"))
        shutil.copy(os.path.join(SOURCE, "tests", "tools", "make_reference.py"),
                    os.path.join(self.source, "tests", "tools"))
        self.log = os.path.join(self.tmp, "python.log")
        self.python = os.path.join(self.tmp, "python3")
        with open(self.python, "w") as f:
            f.write("#!/bin/sh\n"
                    f'if [ -n "${{LD_LIBRARY_PATH:-}}" ]; then echo "LD_LIBRARY_PATH leaked" >> "{self.log}"; exit 9; fi\n'
                    f'echo "$1" >> "{self.log}"\n'
                    'exec /usr/bin/python3 "$@"\n')
        os.chmod(self.python, 0o755)

    def run_model_test(self, python):
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(self.tmp, "bundle", "lib"), CHUNKATTN_PYTHON=python,
                   CHUNKATTN_SOURCE_DIR=self.source,
                   CHUNKATTN_TRANSFORMERS_FIXTURES=os.path.join(self.tmp, "no-fixtures"), TMPDIR=self.tmp)
        return subprocess.run([os.path.join(BUILD, "bin", "chunkattn_model_test"),
                               "--gtest_filter=ModelReferenceTest.FixturesExist:"
                               "ModelReferenceTest.PrefillLogitsMatchReference"],
                              env=env, capture_output=True, text=True, timeout=300)

    def test_generator_from_the_environment_without_the_library_path(self):
        r = self.run_model_test(self.python)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        with open(self.log) as f:
            calls = f.read().splitlines()
        self.assertEqual(calls, [os.path.join(self.source, "tests", "tools", "make_reference.py")])

    def test_the_interpreter_is_the_one_named(self):
        r = self.run_model_test("/bin/false")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("make_reference.py failed", r.stdout)


def main():
    global BUILD, SOURCE
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(here, "..", "..", "build"))
    ap.add_argument("--source", default=os.path.join(here, "..", ".."))
    args, rest = ap.parse_known_args()
    BUILD, SOURCE = os.path.abspath(args.build), os.path.abspath(args.source)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
