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
import socket
import subprocess
import sys
import tarfile
import tempfile
import unittest

BUILD = SOURCE = None

# The steps of each call, in order (what bench/README.md's call table promises).
CALLS = {
    "tests": ["bundle", "gpu-info", "kernels-cuda-test", "memcheck", "racecheck"],
    "kernels": ["bundle", "paper-fp16", "gqa", "bf16", "d64", "chunk32", "chunk128", "torch-baseline"],
    "model": ["bundle", "fixtures", "model-cuda-test", "generate-sampled"],
    "e2e-on": ["bundle", "ready", "info", "np1024-ns0", "np1024-ns1024", "np2048-ns0", "np2048-ns2048",
               "np4096-ns0", "np4096-ns4096"],
}
CALLS["e2e-off"] = CALLS["e2e-on"]

# Libraries the bundle leaves to the GPU host (glibc's, the driver's, cuBLAS, NCCL).
HOST_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|"
                       r"libresolv\.so|libcuda\.so|libnvidia|libcublas|libcublasLt|libnccl)")
DEVICE_TOOL_MAX_FILES = 8
CALL_LIMIT_S = 8 * 60  # each call's steps together
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
        env = dict(os.environ, BUILD_DIR=BUILD, CHUNKATTN_BUNDLE=cls.bundle)
        r = subprocess.run([os.path.join(SOURCE, "scripts", "cuda_session.sh"), "bundle"], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"bundle failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        cls.bundle_log = r.stdout

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
        self.assertEqual(len(bins), 8, bins)
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

    def run_call(self, call):
        out = tempfile.mkdtemp(prefix="out-" + call + "-", dir=self.tmp)
        env = dict(os.environ, TMPDIR=self.tmp, CHUNKATTN_BUNDLE=self.bundle, CHUNKATTN_SESSION_NO_GPU="1",
                   CHUNKATTN_SESSION_STEP_CAP_S=str(STEP_CAP_S), CHUNKATTN_E2E_PORT=str(free_port_pair()))
        r = subprocess.run([os.path.join(SOURCE, "scripts", "cuda_session.sh"), call, out], env=env, cwd=SOURCE,
                           capture_output=True, text=True, timeout=CALL_LIMIT_S)
        return r, out

    def test_every_call_returns_its_table_and_logs(self):
        for call, steps in CALLS.items():
            with self.subTest(call=call):
                r, out = self.run_call(call)
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
                    self.assertLessEqual(seconds, STEP_CAP_S + 6, name)  # the cap and timeout's kill grace
                # The step limits of one call fit one device command (10 minutes) with room.
                self.assertLessEqual(sum(row[4] for row in rows), CALL_LIMIT_S, summary)
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
                if call.startswith("e2e"):
                    # No worker can start: the wait fails, the loads time out, and each still runs.
                    self.assertIn("timeout", statuses)
                    self.assertIn("logs/worker.log", names)
                    self.assertIn("logs/coordinator.log", names)

    def test_collect_puts_results_in_place(self):
        r, out = self.run_call("tests")
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
