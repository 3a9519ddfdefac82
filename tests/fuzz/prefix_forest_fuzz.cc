// The prefix forest against the brute-force model of forest_walk.h (and its
// KV-event stream against the forest, kv_event_index.h), with
// every choice of the walk (chunk size, pool, operations, tokens) read from
// the fuzzer's bytes: an input is a sequence of operations, and any check
// that fails aborts with GoogleTest's message.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "services/kv_events/kv_events.h"
#include "services/tests/forest_walk.h"
#include "services/tests/kv_event_index.h"

namespace {

// Prints what GoogleTest recorded outside a test and aborts, so that
// libFuzzer keeps the input.
void AbortOnFailure() {
  const ::testing::TestResult& result = ::testing::UnitTest::GetInstance()->ad_hoc_test_result();
  if (!result.Failed()) return;
  for (int i = 0; i < result.total_part_count(); ++i) {
    const ::testing::TestPartResult& part = result.GetTestPartResult(i);
    std::fprintf(stderr, "%s:%d: %s\n", part.file_name() ? part.file_name() : "?", part.line_number(),
                 part.message());
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int chunk_sizes[] = {16, 32, 64};
  chunkattn::testing::WalkParams params;
  params.chunk_size = in.PickValueInArray(chunk_sizes);
  params.pool_chunks = in.ConsumeIntegralInRange<int32_t>(8, 96);
  params.record_block_events = true;
  chunkattn::testing::RandomWalk walk(params,
                                      [&in](int lo, int hi) { return in.ConsumeIntegralInRange<int>(lo, hi); });
  // The KV-event stream too: a router applying every event holds exactly
  // the forest's blocks after every operation.
  chunkattn::KvEventTracker tracker(params.chunk_size, "0");
  chunkattn::testing::RouterIndex index;
  auto check_events = [&] {
    std::vector<chunkattn::KvEvent> events;
    tracker.Convert(walk.TakeBlockEvents(), &events);
    index.Apply(events, params.chunk_size);
    EXPECT_EQ(index.ByNamespace(), chunkattn::testing::ForestBlocks(walk.forest(), "0"));
  };
  // Each operation takes at least one byte: the walk ends with the input.
  for (int step = 0; step < 4000 && in.remaining_bytes() > 0; ++step) {
    walk.Step();
    if (!::testing::Test::HasFailure()) check_events();
    if (::testing::Test::HasFailure()) break;
  }
  AbortOnFailure();
  walk.Finish();
  check_events();
  AbortOnFailure();
  return 0;
}
