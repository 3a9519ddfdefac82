"""Runs test classes of several modules in one process, e.g.

  run_classes.py --build build test_api.CancelTest test_prefix_cache.CacheSurvivesTest

so that the classes asking for the same shared cluster
(harness.ServiceTestCase.start_cluster(shared=True)) start it once between
them (tests/services/CMakeLists.txt)."""
import harness

if __name__ == '__main__':
    harness.main()
