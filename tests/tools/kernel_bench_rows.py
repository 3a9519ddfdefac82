"""chunkattn-kernel-bench keeps going past a failing configuration.

Runs a small Table 3 grid with an agreement tolerance no two impls can meet
where the prefix is shared (tpp and seq then sum in different orders; with
n_s = 0 they run the same code and agree exactly), and checks that every
configuration has its rows, the disagreeing ones written as failed with
their error, the agreeing ones as passed with their timings, in grid order,
and that the exit status reports the failure. Each configuration's context
has a version no other one has (a CUDA plan is reused while the version
holds: configurations that shared a version would time a stale plan).

Usage: kernel_bench_rows.py BENCH_BINARY OUT_JSON
"""
import json
import subprocess
import sys

bench, out = sys.argv[1], sys.argv[2]
r = subprocess.run([bench, "--grid", "paper", "--batch", "2", "--heads", "2", "--head_dim", "16", "--chunk", "16",
                    "--repeat", "1", "--warmup", "0", "--impl", "tpp,seq", "--agree_tol", "1e-30", "--json", out],
                   capture_output=True, text=True, timeout=300)
assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
rows = json.load(open(out))
grid = [(np_, ns) for np_ in (1024, 2048, 4096) for ns in (0, 1024, 2048, 4096) if ns <= np_]
assert [(x["np"], x["ns"], x["impl"]) for x in rows] == [(a, b, i) for a, b in grid for i in ("tpp", "seq")], rows
failed = 0
for x in rows:
    assert x["commit"] and x["command"].count("--agree_tol") == 1, x
    assert x["median_us"] > 0 and x["tolerance"] == 1e-30, x
    should_pass = x["impl"] == "tpp" or x["ns"] == 0
    assert x["ok"] is should_pass, x
    if not should_pass:
        failed += 1
        assert x["error"].startswith("max |diff| "), x
    else:
        assert "error" not in x, x
assert f"{failed} rows failed" in r.stderr, r.stderr
versions = {}
for x in rows:
    versions.setdefault((x["np"], x["ns"]), set()).add(x["context_version"])
assert all(len(v) == 1 for v in versions.values()), versions
assert len({next(iter(v)) for v in versions.values()}) == len(grid), versions
print(f"kernel bench rows ok: {len(rows)} rows, {failed} failed and written")
