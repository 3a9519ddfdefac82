"""Where and how a result was measured, for the JSON the Python benchmark
drivers write (bench/soak.py, bench/fuzz.sh): the machine, its CPU, the
commit (with "-dirty" when tracked files differ) and the exact command, as
bench_util.h does for the C++ benchmarks."""
import json
import os
import socket
import subprocess
import time


def _cpu():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return 'unknown'


def _git(source, *args):
    try:
        return subprocess.run(['git', '-C', source] + list(args), capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ''


def machine_info(source, command):
    """machine, cpu, cores, commit, command and time (UTC) as a dict."""
    commit = _git(source, 'rev-parse', 'HEAD') or 'unknown'
    if _git(source, 'status', '--porcelain', '--untracked-files=no'):
        commit += '-dirty'
    return dict(machine=socket.gethostname(), cpu=_cpu(), cores=os.cpu_count(), commit=commit, command=command,
                time=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))


def write_result(path, doc):
    """Writes a benchmark's JSON document atomically (a temporary file, then a
    rename), creating the folder, and says so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    os.replace(path + '.tmp', path)
    print('wrote %s' % path)
