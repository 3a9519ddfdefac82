"""A worker dies mid-stream (SIGKILL, TP=2): the client learns within 5 s,
health goes NOT_SERVING, and serving resumes once the worker is back on its
port."""
import random
import time
import unittest

import grpc

import harness


class WorkerFailureTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('failure', tp=2)

    def test_kill_and_restart_a_worker(self):
        c = self.cluster
        probe = harness.make_request(prompt_ids=[5, 6, 7, 8, 9], temperature=0.0, max_new_tokens=6,
                                     ignore_eos=True)
        reference = c.generate(probe)[0]

        prompt = harness.random_ids(random.Random(8), 100)
        call = c.stub.Generate(harness.make_request(
            prompt_ids=prompt, temperature=0.0, max_new_tokens=2000, ignore_eos=True), timeout=120)
        tokens = 0
        killed_at = None
        with self.assertRaises(grpc.RpcError) as e:
            for response in call:
                tokens += len(response.token_ids)
                self.assertEqual(response.finish_reason, harness.pb.FINISH_REASON_UNSPECIFIED,
                                 'the long request finished before the worker was killed')
                if killed_at is None and tokens >= 3:
                    c.kill_worker(1)
                    killed_at = time.monotonic()
        failed_at = time.monotonic()
        self.assertIsNotNone(killed_at)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())
        self.assertLessEqual(failed_at - killed_at, 5.0, 'UNAVAILABLE came %.1f s after the kill' %
                             (failed_at - killed_at))

        c.wait_health(harness.NOT_SERVING, timeout=10, check_alive=False)
        with self.assertRaises(grpc.RpcError) as e:
            c.generate(probe, timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())

        c.start_worker(1)
        c.wait_health(harness.SERVING, timeout=30)
        again = c.generate(probe)[0]
        self.assertEqual(again.finish_reason, harness.pb.FINISH_REASON_LENGTH)
        self.assertEqual(again.tokens, reference.tokens)


if __name__ == '__main__':
    harness.main()
