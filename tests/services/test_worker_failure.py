"""A worker dies mid-stream (SIGKILL, TP=2): the client learns within 5 s,
health goes NOT_SERVING, and serving resumes once the worker is back on its
port. SIGTERM ends a coordinator and a worker cleanly within a bound, also
with a stream in flight."""
import random
import signal
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


class ShutdownTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('shutdown', tp=1)

    def test_sigterm_with_a_stream_in_flight(self):
        c = self.cluster
        call = c.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(random.Random(3), 100), temperature=0.0, max_new_tokens=2000,
            ignore_eos=True), timeout=60)
        responses = iter(call)
        next(responses)  # the stream is running, and with it the worker's plan stream
        # The worker first: its plan stream stays open as long as the
        # coordinator holds it, so only a bounded shutdown lets it exit.
        worker = c.workers[0]
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        self.assertEqual(worker.proc.wait(timeout=20), 0, worker.log_tail())
        self.assertLess(time.monotonic() - started, 10, 'the worker took too long to stop')
        self.assertIn('worker: shutting down', worker.log_tail())
        try:  # finished within the worker's grace period, or cut off with it
            for _ in responses:
                pass
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())

        started = time.monotonic()
        c.coordinator.proc.send_signal(signal.SIGINT)
        self.assertEqual(c.coordinator.proc.wait(timeout=20), 0, c.coordinator.log_tail())
        self.assertLess(time.monotonic() - started, 10, 'the coordinator took too long to stop')
        self.assertIn('coordinator: shutting down', c.coordinator.log_tail())


if __name__ == '__main__':
    harness.main()
