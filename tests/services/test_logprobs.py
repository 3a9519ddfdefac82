"""top_logprobs through the real coordinator and CPU workers, against the
float64 NumPy forward pass of a tiny Qwen3 model (tests/tools/make_reference.py,
the model tests' reference): every token carries its N most likely tokens,
most likely first, aligned with token_ids and logprobs; the greedy token
leads them with its own logprob; and the entries are the reference's
log-softmax. Also the argument checks, and the same under TP=2."""
import math
import os
import random
import re
import subprocess
import sys

import grpc

import harness

MODEL = 'qwen3_qk_norm'
# The fp32 CPU model's logprobs are within ~1e-6 nats of the float64
# reference's here; two tokens closer than this may be ranked either way.
TOLERANCE = 1e-4


def make_reference_model(folder):
    """Writes the reference's MODEL into folder; returns ids -> float64 logits."""
    sys.path.insert(0, os.path.join(harness.SOURCE, 'tests', 'tools'))
    try:
        import make_reference  # noqa: E402 (numpy, Debian's python3-numpy)
    finally:
        sys.path.pop(0)
    seed = 1000 + list(make_reference.MODELS).index(MODEL)  # as make_reference.main()
    logits_fn, _ = make_reference.build_numpy(MODEL, make_reference.MODELS[MODEL], seed, folder)
    return logits_fn


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def stream(cluster, request):
    """Every response of one Generate call."""
    return list(cluster.stub.Generate(request, timeout=harness.RPC_TIMEOUT_S))


class TopLogprobsTest(harness.ServiceTestCase):
    TP = 1

    @harness.setup_class_or_dump
    def setUpClass(cls):
        folder = harness.temp_dir('chunkattn-toplp-model-', cls.addClassCleanup)
        cls.logits_fn = staticmethod(make_reference_model(folder))  # not a method of the test
        cls.cluster = cls.start_cluster('toplp-tp%d' % cls.TP, tp=cls.TP, model=folder)

    def request(self, prompt, top_logprobs, logprobs=True, **kwargs):
        req = harness.make_request(prompt_ids=prompt, namespace=harness.fresh_namespace('toplp'),
                                   ignore_eos=True, logprobs=logprobs, **kwargs)
        req.top_logprobs = top_logprobs
        return req

    def check_aligned(self, responses, n):
        """Per sample index: (tokens, logprobs, [(ids, logprobs)] per token)."""
        samples = {}
        for r in responses:
            self.assertEqual(len(r.logprobs), len(r.token_ids))
            self.assertEqual(len(r.top_logprobs), len(r.token_ids) if n > 0 else 0)
            s = samples.setdefault(r.index, ([], [], []))
            s[0].extend(r.token_ids)
            s[1].extend(r.logprobs)
            for t in r.top_logprobs:
                self.assertEqual(len(t.token_ids), n)
                self.assertEqual(len(t.logprobs), n)
                self.assertEqual(len(set(t.token_ids)), n, 'an id twice')
                for a, b in zip(t.logprobs, t.logprobs[1:]):
                    self.assertGreaterEqual(a, b, 'not most likely first')
                self.assertTrue(all(x <= 0 for x in t.logprobs))
                s[2].append((list(t.token_ids), list(t.logprobs)))
        for tokens, logprobs, tops in samples.values():
            for token, logprob, (ids, lps) in zip(tokens, logprobs, tops):
                if token in ids:  # the sampled token's entry is its logprob, to the bit
                    self.assertEqual(lps[ids.index(token)], logprob)
        return samples

    def test_greedy_top5_matches_the_reference(self):
        rng = random.Random(11)
        for length in (1, 9, 70):
            prompt = harness.random_ids(rng, length, high=256)
            with self.subTest(prompt_len=length):
                samples = self.check_aligned(stream(self.cluster, self.request(
                    prompt, 5, temperature=0.0, max_new_tokens=8)), 5)
                self.assertEqual(list(samples), [0])
                tokens, logprobs, tops = samples[0]
                self.assertEqual(len(tokens), 8)
                self.assertEqual(len(tops), 8)
                for t, (ids, lps) in enumerate(tops):
                    self.assertEqual(ids[0], tokens[t], 'the greedy token leads')
                    self.assertEqual(lps[0], logprobs[t])
                    ref = log_softmax(list(self.logits_fn(prompt + tokens[:t])[-1]))
                    order = sorted(range(len(ref)), key=lambda i: (-ref[i], i))
                    for j, (i, lp) in enumerate(zip(ids, lps)):
                        where = 'token %d entry %d (id %d)' % (t, j, i)
                        self.assertAlmostEqual(lp, ref[i], delta=TOLERANCE, msg=where)
                        # Ranked where the reference ranks it, up to a near tie.
                        self.assertAlmostEqual(ref[i], ref[order[j]], delta=TOLERANCE, msg=where)

    def test_sampled_samples_carry_top20(self):
        rng = random.Random(12)
        prompt = harness.random_ids(rng, 30, high=256)
        samples = self.check_aligned(stream(self.cluster, self.request(
            prompt, 20, temperature=0.9, top_k=40, repetition_penalty=1.2, seed=3, n=2,
            max_new_tokens=6)), 20)
        self.assertEqual(sorted(samples), [0, 1])
        for tokens, _, tops in samples.values():
            self.assertEqual(len(tops), len(tokens))
            for t, (ids, lps) in enumerate(tops):
                # Of the raw logits, whatever the penalty and temperature did.
                ref = log_softmax(list(self.logits_fn(prompt + tokens[:t])[-1]))
                for i, lp in zip(ids, lps):
                    self.assertAlmostEqual(lp, ref[i], delta=TOLERANCE)

    def test_none_unless_asked(self):
        prompt = [5, 6, 7, 8]
        for responses in (stream(self.cluster, self.request(prompt, 0, temperature=0.0, max_new_tokens=3)),
                          stream(self.cluster, self.request(prompt, 0, logprobs=False, max_new_tokens=3))):
            self.assertTrue(responses)
            for r in responses:
                self.assertEqual(len(r.top_logprobs), 0)

    def test_bad_values_are_invalid_argument(self):
        for req, mention in ((self.request([5, 6], 21), 'top_logprobs must be in [0, 20]'),
                             (self.request([5, 6], 1000), 'top_logprobs must be in [0, 20]'),
                             (self.request([5, 6], 5, logprobs=False), 'top_logprobs')):
            with self.subTest(top_logprobs=req.top_logprobs, return_logprobs=req.return_logprobs):
                with self.assertRaises(grpc.RpcError) as e:
                    stream(self.cluster, req)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                self.assertIn(mention, e.exception.details())
        # The edges are valid.
        self.check_aligned(stream(self.cluster, self.request([5, 6], 20, max_new_tokens=2)), 20)

    def test_cli_prints_top_logprobs(self):
        cli = harness.bin_path('chunkattn')
        if not os.access(cli, os.X_OK):
            self.skipTest('build/bin/chunkattn is missing')
        r = subprocess.run([cli, 'generate', '--server', '127.0.0.1:%d' % self.cluster.port,
                            '--prompt_ids', '5,6,7', '--temperature', '0', '--max_new_tokens', '3',
                            '--ignore_eos', '--logprobs', '--top_logprobs', '4'],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        # "logprobs: id:lp ..." and "top_logprobs[t]: id:lp ..." per token, greedy first.
        logprobs = re.search(r'(?m)^logprobs:(.*)$', r.stderr)
        self.assertIsNotNone(logprobs, r.stderr)
        tokens = [p.split(':')[0] for p in logprobs.group(1).split()]
        tops = re.findall(r'(?m)^top_logprobs\[(\d+)\]:(.*)$', r.stderr)
        self.assertEqual([int(t) for t, _ in tops], [0, 1, 2], r.stderr)
        for (_, entries), token in zip(tops, tokens):
            entries = entries.split()
            self.assertEqual(len(entries), 4)
            self.assertEqual(entries[0].split(':')[0], token)


class TopLogprobsTensorParallelTest(TopLogprobsTest):
    """The same over two workers: rank 0 samples from the all-reduced logits."""
    TP = 2


if __name__ == '__main__':
    harness.main()
