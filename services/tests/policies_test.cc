// The admission and preemption policies alone (against brute-force orders),
// then through the Scheduler with a manual clock and the null executor.
#include "services/core/policies.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/random/random.h"
#include "gtest/gtest.h"
#include "services/core/null_executor.h"
#include "services/core/scheduler.h"
#include "services/tests/plan_limits.h"

namespace chunkattn {
namespace {

std::vector<QueuedRequest> RandomRequests(absl::BitGen& gen, int n) {
  std::vector<QueuedRequest> v;
  for (int i = 0; i < n; ++i) {
    QueuedRequest r;
    r.priority = absl::Uniform(gen, -3, 4);
    r.arrival = absl::UnixEpoch() + absl::Seconds(absl::Uniform(gen, 0, 100));  // ties are common
    r.sequence = i;
    v.push_back(r);
  }
  return v;
}

TEST(AdmissionPolicyTest, StrictOrderIsPriorityThenArrivalThenSequence) {
  AdmissionPolicy policy;
  absl::BitGen gen(std::seed_seq{1});
  for (int round = 0; round < 200; ++round) {
    std::vector<QueuedRequest> v = RandomRequests(gen, 30);
    std::vector<QueuedRequest> by_key = v, expected = v;
    std::sort(by_key.begin(), by_key.end(),
              [&](const QueuedRequest& a, const QueuedRequest& b) { return policy.Key(a) < policy.Key(b); });
    std::sort(expected.begin(), expected.end(), [](const QueuedRequest& a, const QueuedRequest& b) {
      return std::make_tuple(a.priority, a.arrival, a.sequence) < std::make_tuple(b.priority, b.arrival, b.sequence);
    });
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(by_key[i].sequence, expected[i].sequence) << round;
  }
}

TEST(AdmissionPolicyTest, AgingLetsAWaitingRequestOvertakeLaterUrgentOnes) {
  AdmissionPolicy policy(absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(500000);
  const QueuedRequest low{3, t0, 0};  // three levels below the default
  // One level per 10 s waited: 30 s later it ties with priority 0; the
  // sequence number then keeps arrival order.
  EXPECT_TRUE(policy.Key({0, t0 + absl::Seconds(29), 1}) < policy.Key(low));
  EXPECT_TRUE(policy.Key(low) < policy.Key({0, t0 + absl::Seconds(30), 1}));
  EXPECT_TRUE(policy.Key(low) < policy.Key({0, t0 + absl::Seconds(31), 1}));
  // Strict priority never lets it through.
  AdmissionPolicy strict;
  EXPECT_TRUE(strict.Key({0, t0 + absl::Hours(1000), 1}) < strict.Key(low));
  // The extremes do not overflow: the most urgent request a day later still
  // orders against the least urgent one from now.
  AdmissionPolicy day(AdmissionPolicy::kMaxAging);
  EXPECT_TRUE(day.Key({kMinPriority, t0 + absl::Hours(24), 1}) < day.Key({kMaxPriority, t0, 0}));
  EXPECT_TRUE(day.Key({kMaxPriority, t0, 0}) < day.Key({kMaxPriority, t0 + absl::Seconds(1), 1}));
}

TEST(PreemptionPolicyTest, VictimIsWhatAdmissionWouldTakeLast) {
  for (absl::Duration aging : {absl::ZeroDuration(), absl::Seconds(7)}) {
    AdmissionPolicy order(aging);
    PreemptionPolicy policy(&order);
    EXPECT_EQ(policy.Victim({}), -1);
    absl::BitGen gen(std::seed_seq{2});
    for (int round = 0; round < 500; ++round) {
      std::vector<QueuedRequest> v = RandomRequests(gen, absl::Uniform(gen, 1, 20));
      std::shuffle(v.begin(), v.end(), gen);
      int expected = 0;
      for (int i = 1; i < static_cast<int>(v.size()); ++i) {
        if (order.Key(v[expected]) < order.Key(v[i])) expected = i;
      }
      ASSERT_EQ(policy.Victim(v), expected);
      // The brute-force statement: no running request comes later.
      for (const QueuedRequest& r : v) ASSERT_FALSE(order.Key(v[expected]) < order.Key(r));
    }
  }
}

// The scheduler with the null executor: the step of each request's first and
// last token.
struct Timeline {
  std::map<RequestId, int> first, last;
  int64_t preemptions = 0;
};

Timeline RunToIdle(Scheduler* s) {
  Timeline t;
  StepPlan plan;
  StepResult result;
  for (int step = 0; step < 10000 && s->HasWork(); ++step) {
    absl::StatusOr<bool> scheduled = s->Schedule(&plan);
    EXPECT_TRUE(scheduled.ok()) << scheduled.status();
    if (!scheduled.ok() || !*scheduled) break;
    testing::ExpectPlanWithinLimits(plan, s->options());
    NullExecute(plan, &result);
    std::vector<SampleEvent> events;
    EXPECT_TRUE(s->Complete(result, &events).ok());
    for (const SampleEvent& e : events) {
      t.first.emplace(e.request, step);
      t.last[e.request] = step;
    }
  }
  EXPECT_FALSE(s->HasWork());
  EXPECT_EQ(s->cache_stats().used_chunks, 0);
  t.preemptions = s->stats().preemptions_total;
  return t;
}

RequestSpec Spec(TokenId first_token, int32_t max_new, int32_t priority) {
  RequestSpec spec;
  for (int i = 0; i < 16; ++i) spec.prompt.push_back(first_token + i);
  spec.max_new_tokens = max_new;
  spec.priority = priority;
  return spec;
}

std::unique_ptr<Scheduler> MakeScheduler(int32_t num_chunks, int32_t batch, const Clock* clock,
                                         absl::Duration aging = absl::ZeroDuration(), double tenant_share = 1.0) {
  SchedulerOptions o;
  o.tenant_max_batch_share = tenant_share;
  o.chunk_size = 16;
  o.num_chunks = num_chunks;
  o.max_context = 512;
  o.max_batch_size = batch;
  o.max_tokens_per_step = 64;
  o.clock = clock;
  o.priority_aging = aging;
  return Scheduler::Create(o).value();
}

TEST(SchedulerPolicyTest, WaitingRequestsAreAdmittedByPriority) {
  ManualClock clock;
  auto s = MakeScheduler(64, 1, &clock);  // one request at a time
  ASSERT_TRUE(s->Add(1, Spec(100, 4, 0)).ok());
  ASSERT_TRUE(s->Add(2, Spec(200, 4, 5)).ok());
  ASSERT_TRUE(s->Add(3, Spec(300, 4, 0)).ok());
  ASSERT_TRUE(s->Add(4, Spec(400, 4, -2)).ok());
  const Timeline t = RunToIdle(s.get());
  // The first Schedule sees all four: the most urgent first, FCFS within
  // one priority.
  EXPECT_LT(t.first.at(4), t.first.at(1));
  EXPECT_LT(t.first.at(1), t.first.at(3));  // equal priority: FCFS
  EXPECT_LT(t.first.at(3), t.first.at(2));
}

TEST(SchedulerFairShareTest, AFloodingTenantDoesNotStarveAnother) {
  // Tenant a queues 24 requests of 20 tokens in a batch of 4; then b sends
  // one, more urgent by the priority it chose (which must not matter across
  // tenants either way). As its own tenant, b takes the first free slot;
  // sent as a, it waits behind a's queue.
  std::map<bool, int> first_b;
  for (bool separate : {true, false}) {
    auto s = MakeScheduler(256, 4, nullptr);
    for (int i = 0; i < 24; ++i) {
      RequestSpec spec = Spec(100 + 32 * i, 20, 0);
      spec.ignore_eos = true;
      spec.tenant = "t:a";
      ASSERT_TRUE(s->Add(i, spec).ok());
    }
    RequestSpec b = Spec(5000, 5, 0);
    b.tenant = separate ? "t:b" : "t:a";
    ASSERT_TRUE(s->Add(100, b).ok());
    const Timeline t = RunToIdle(s.get());
    first_b[separate] = t.first.at(100);
    // Never more than the batch, whatever the order.
    EXPECT_EQ(t.first.size(), 25u);
  }
  EXPECT_LE(first_b[true], 22);   // one round of a's requests
  EXPECT_GT(first_b[false], 100);  // five rounds
  // A tenant's priority orders its own requests, not another tenant's share:
  // a's urgent flood still lets b's next request in at the first free slot.
  auto s = MakeScheduler(256, 4, nullptr);
  for (int i = 0; i < 24; ++i) {
    RequestSpec spec = Spec(100 + 32 * i, 20, kMinPriority);
    spec.ignore_eos = true;
    spec.tenant = "t:a";
    ASSERT_TRUE(s->Add(i, spec).ok());
  }
  RequestSpec b = Spec(5000, 5, kMaxPriority);
  b.tenant = "t:b";
  ASSERT_TRUE(s->Add(100, b).ok());
  EXPECT_LE(RunToIdle(s.get()).first.at(100), 22);
}

TEST(SchedulerFairShareTest, ATenantsShareLeavesASlotFree) {
  // A share of 1/2: tenant a never holds more than 2 of the 4 slots, so b's
  // request, sent while a's flood runs, starts in the next step; the shared
  // tenant "" (no tokens) is not bounded.
  for (const std::string tenant : {"t:a", ""}) {
    auto s = MakeScheduler(256, 4, nullptr, absl::ZeroDuration(), 0.5);
    for (int i = 0; i < 8; ++i) {
      RequestSpec spec = Spec(100 + 32 * i, 30, 0);
      spec.ignore_eos = true;
      spec.tenant = tenant;
      ASSERT_TRUE(s->Add(i, spec).ok());
    }
    StepPlan plan;
    StepResult result;
    int most = 0;
    for (int step = 0; step < 40 && s->HasWork(); ++step) {
      ASSERT_TRUE(*s->Schedule(&plan));
      most = std::max<int>(most, static_cast<int>(s->tenant_loads()[tenant].running_sequences));
      NullExecute(plan, &result);
      std::vector<SampleEvent> events;
      ASSERT_TRUE(s->Complete(result, &events).ok());
    }
    EXPECT_EQ(most, tenant.empty() ? 4 : 2) << "tenant '" << tenant << "'";
  }
  SchedulerOptions bad;
  bad.num_chunks = 64;
  for (double share : {0.0, -1.0, 1.5}) {
    bad.tenant_max_batch_share = share;
    EXPECT_TRUE(absl::IsInvalidArgument(Scheduler::Create(bad).status())) << share;
  }
}

TEST(SchedulerFairShareTest, ANewcomersFirstStepLeavesAFloodsRowsOutOneStepAtATime) {
  // Tenant a decodes 4 requests; b's requests come one per step. The step
  // that prefills b's first has no row of a's (so b's first token is not
  // slowed by a's batch), the next has a's rows again although another b
  // request prefills in it, and so on: a decodes at least every other step.
  // Without names (one shared tenant) or from a itself, nothing sits out.
  for (const std::string newcomer : {"t:b", "t:a", ""}) {
    SCOPED_TRACE("newcomer '" + newcomer + "'");
    auto s = MakeScheduler(256, 16, nullptr);
    for (int i = 0; i < 4; ++i) {
      RequestSpec spec = Spec(100 + 32 * i, 40, 0);
      spec.ignore_eos = true;
      spec.tenant = newcomer.empty() ? "" : "t:a";
      ASSERT_TRUE(s->Add(i, spec).ok());
    }
    StepPlan plan;
    StepResult result;
    auto step = [&](std::map<RequestId, int>* tokens) {
      ASSERT_TRUE(*s->Schedule(&plan));
      NullExecute(plan, &result);
      std::vector<SampleEvent> events;
      ASSERT_TRUE(s->Complete(result, &events).ok());
      for (const SampleEvent& e : events) ++(*tokens)[e.request];
    };
    for (int k = 0; k < 2; ++k) {
      std::map<RequestId, int> warmup;
      step(&warmup);
    }
    int a_steps = 0;
    for (int k = 0; k < 6; ++k) {
      RequestSpec b = Spec(4000 + 32 * k, 2, 0);
      b.tenant = newcomer;
      ASSERT_TRUE(s->Add(100 + k, b).ok());
      std::map<RequestId, int> tokens;
      step(&tokens);
      EXPECT_EQ(tokens[100 + k], 1) << "step " << k << ": the newcomer's first token";
      const bool a_decoded = tokens[0] == 1 && tokens[1] == 1 && tokens[2] == 1 && tokens[3] == 1;
      EXPECT_TRUE(a_decoded || (tokens[0] + tokens[1] + tokens[2] + tokens[3]) == 0) << "step " << k;
      if (newcomer == "t:b") {
        EXPECT_EQ(a_decoded, k % 2 == 1) << "step " << k;
      } else {
        EXPECT_TRUE(a_decoded) << "step " << k;
      }
      a_steps += a_decoded ? 1 : 0;
    }
    EXPECT_GE(a_steps, 3);
  }
}

TEST(SchedulerPolicyTest, AgingThroughTheInjectedClock) {
  for (bool aging : {false, true}) {
    ManualClock clock;
    auto s = MakeScheduler(64, 1, &clock, aging ? absl::Seconds(10) : absl::ZeroDuration());
    ASSERT_TRUE(s->Add(1, Spec(100, 2, 2)).ok());  // low priority, first
    clock.Advance(absl::Seconds(25));              // more than two levels waited
    ASSERT_TRUE(s->Add(2, Spec(200, 2, 0)).ok());
    const Timeline t = RunToIdle(s.get());
    if (aging) {
      EXPECT_LT(t.first.at(1), t.first.at(2));
    } else {
      EXPECT_LT(t.first.at(2), t.first.at(1));
    }
  }
}

TEST(SchedulerPolicyTest, TheLowPriorityRequestIsPreemptedEvenWhenOlder) {
  // Two requests of 16 + 40 tokens (4 chunks each at full length) in a pool
  // of 6: both are admitted, and at 49 tokens one must give way.
  for (int32_t old_priority : {0, 5}) {
    auto s = MakeScheduler(6, 8, nullptr);
    ASSERT_TRUE(s->Add(1, Spec(100, 40, old_priority)).ok());
    ASSERT_TRUE(s->Add(2, Spec(200, 40, 0)).ok());
    const Timeline t = RunToIdle(s.get());
    ASSERT_GE(t.preemptions, 1);
    if (old_priority == 0) {
      EXPECT_LT(t.last.at(1), t.last.at(2));  // the newer one (2) gave way
    } else {
      EXPECT_LT(t.last.at(2), t.last.at(1));  // the low-priority one (1) gave way
    }
  }
}

TEST(SchedulerPolicyTest, RejectsPrioritiesOutOfRangeAndBadAging) {
  auto s = MakeScheduler(64, 4, nullptr);
  EXPECT_EQ(s->Add(1, Spec(100, 4, kMaxPriority + 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Add(2, Spec(100, 4, kMinPriority - 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->Add(3, Spec(100, 4, kMinPriority)).ok());
  SchedulerOptions o;
  o.num_chunks = 64;
  o.priority_aging = absl::Seconds(-1);
  EXPECT_EQ(Scheduler::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.priority_aging = AdmissionPolicy::kMaxAging + absl::Seconds(1);
  EXPECT_EQ(Scheduler::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
