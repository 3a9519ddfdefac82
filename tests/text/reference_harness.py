"""What the differential text tests share: child processes that die with the
test and are killed at its exit, temporary folders removed at exit or on
SIGTERM/SIGHUP (CHUNKATTN_KEEP_TEST_LOGS=1 keeps them), the reference
install, and JSONL reading that splits on "\\n" only.

Importing it installs the exit and signal handlers."""
import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile

live = []         # running Popen objects, killed at exit
_temp_dirs = []   # removed at exit
_owner_pid = os.getpid()


def die_with_parent():
    """preexec_fn: PR_SET_PDEATHSIG (1) = SIGKILL the child when this thread
    exits, so a killed test leaves no encoder or renderer running."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def _remove(folder):
    if folder in _temp_dirs:
        _temp_dirs.remove(folder)
        if os.environ.get("CHUNKATTN_KEEP_TEST_LOGS", "") not in ("", "0"):
            print("kept %s" % folder, file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _cleanup():
    if os.getpid() != _owner_pid:
        return
    for proc in list(live):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for folder in list(_temp_dirs):
        _remove(folder)


def _on_signal(signum, frame):
    # Not sys.exit(): unittest would record SystemExit as a test error and go on.
    _cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


def temp_dir(prefix, add_cleanup):
    """A fresh folder, removed by add_cleanup (a test's or a class's) or at exit."""
    folder = tempfile.mkdtemp(prefix=prefix)
    _temp_dirs.append(folder)
    add_cleanup(_remove, folder)
    return folder


def install_reference(source):
    """The folder scripts/install-hf-reference.sh prints; fails the test when
    the script fails (these tests never skip without the reference)."""
    script = os.path.join(source, "scripts", "install-hf-reference.sh")
    r = subprocess.run([script], capture_output=True, text=True, timeout=900, preexec_fn=die_with_parent)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise AssertionError("%s failed (exit %d): the reference files are needed and this test "
                             "does not skip without them\n%s" % (script, r.returncode, r.stderr[-3000:]))
    return lines[-1]


def read_lines(path):
    """A JSONL file's lines, split on b"\\n" only (texts hold raw U+2028, U+0085)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def first_difference(a, b):
    """The first index where sequences a and b differ (or the shorter's length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
