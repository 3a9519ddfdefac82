"""TP=2 (two worker processes) generates what TP=1 generates, greedily."""
import random
import unittest

import harness


class TensorParallelTest(harness.ServiceTestCase):

    def run_prompts(self, cluster):
        rng = random.Random(7)
        prompts = [dict(prompt_ids=harness.random_ids(rng, n)) for n in (5, 64, 70, 300)]
        prompts.append(dict(text='To be, or not to be, that is the question:'))
        outputs = []
        for p in prompts:
            samples = cluster.generate(harness.make_request(
                temperature=0.0, max_new_tokens=24, ignore_eos=True, **p))
            self.assertEqual(list(samples), [0])
            s = samples[0]
            self.assertEqual(s.finish_reason, harness.pb.FINISH_REASON_LENGTH)
            self.assertEqual(s.completion_tokens, 24)
            outputs.append((s.tokens, s.text))
        # Constrained (structured outputs): the masks follow each plan to rank 0
        # while the ranks run its forward pass.
        for field, value, pattern in (('regex', '[a-z]{4}-[0-9]{3}', r'[a-z]{4}-[0-9]{3}'),
                                      ('json_schema', '{"type": "object", "properties": {"n": {"type": "integer", '
                                                      '"minimum": 0, "maximum": 999}}, "required": ["n"]}',
                                       r'\{"n": ?[0-9]{1,3}\}')):
            for temperature in (0.0, 1.0):
                request = harness.make_request(prompt_ids=harness.random_ids(rng, 40), temperature=temperature,
                                               seed=5, max_new_tokens=48)
                setattr(request.constraint, field, value)
                s = cluster.generate(request)[0]
                self.assertRegex(s.text, '^' + pattern + '$')
                self.assertEqual(s.finish_reason, harness.pb.FINISH_REASON_STOP_TOKEN)
                if temperature == 0.0:  # greedy: the same tokens on both (a draw may sit on a rounding edge)
                    outputs.append((s.tokens, s.text))
        return outputs

    def test_tp2_equals_tp1(self):
        tp1 = self.start_cluster('tp1', shared=True, tp=1)
        self.assertEqual(tp1.model_info().tensor_parallel_size, 1)
        out1 = self.run_prompts(tp1)
        tp2 = self.start_cluster('tp2', tp=2)
        self.assertEqual(tp2.model_info().tensor_parallel_size, 2)
        out2 = self.run_prompts(tp2)
        for i, (a, b) in enumerate(zip(out1, out2)):
            self.assertEqual(a[0], b[0], 'prompt %d: TP=2 tokens differ from TP=1' % i)
            self.assertEqual(a[1], b[1], 'prompt %d: TP=2 text differs from TP=1' % i)


if __name__ == '__main__':
    harness.main()
