// chunkattn-step-bench: the coordinator's own cost per decode step, with no
// model: `--batch` requests behind one long shared prefix, all decoding, and
// per step the phases the coordinator's loop thread runs:
//   schedule  Scheduler::Schedule (feedback, admission, rows, the C++ plan)
//   to_wire   the plan's worker.proto form (plan_proto.h), once per step
//   serialize the wire bytes, once per rank (what each stream's Write costs)
//   result    rank 0's reply parsed and converted back
//   complete  Scheduler::Complete (tokens fed back, events)
// Medians over `--steps` steps in each of `--repeats` runs (the median of the
// runs' medians is reported), with the p99 of all steps. For comparison it
// also times what the worker pool did per step before its stream threads
// became persistent: start and join one std::thread per rank.
//
// With --constrained N, N of the requests carry a JSON-schema constraint
// (structured outputs) on Qwen3's vocabulary, so `schedule` includes their
// token masks (computed on this loop, services/coordinator/grammar_constraint.h)
// and `to_wire` their encoding; each repeat then also runs the same batch
// unconstrained, and the table gives both and their ratio. The workers'
// side draws each constrained token uniformly among the allowed text
// tokens (never a stop token, nor one closing the array), so outputs keep going.
//
//   chunkattn-step-bench --batch 256 --shared_len 2048 --json bench/results/step-cpu.json
//   chunkattn-step-bench --batch 64 --constrained 64 --json bench/results/step-structured-cpu.json
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "proto/plan/plan_proto.h"
#include "services/coordinator/grammar_constraint.h"
#include "services/core/null_executor.h"
#include "services/core/scheduler.h"
#include "text/hf_tokenizer.h"

ABSL_FLAG(int, batch, 256, "requests decoding together");
ABSL_FLAG(int, shared_len, 2048, "tokens of the prefix every request shares");
ABSL_FLAG(int, question_len, 32, "tokens of each request's own suffix");
ABSL_FLAG(int, chunk_size, 64, "tokens per KV chunk");
ABSL_FLAG(int, ranks, 2, "tensor-parallel ranks the plan is serialized for");
ABSL_FLAG(int, steps, 200, "timed decode steps per run");
ABSL_FLAG(int, repeats, 5, "runs");
ABSL_FLAG(std::string, json, "", "write the result here");
ABSL_FLAG(int, constrained, 0, "requests of the batch with a JSON-schema constraint (0 = none)");
ABSL_FLAG(int, mask_threads, 1,
          "threads computing a step's masks (the coordinator's --mask_threads; the masks are inline here)");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json for --constrained (default: Qwen3's, install-hf-reference.sh)");
ABSL_FLAG(std::string, schema, "",
          "JSON Schema file for --constrained (default: an unbounded array of tool-call arguments)");

// An array of calls' arguments with no end (the draws never close it): the
// masks walk strings, enums, integers, booleans and punctuation over and over.
constexpr char kDefaultSchema[] = R"({"type": "array", "items": {"type": "object", "properties": {
  "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
  "days": {"type": "integer", "minimum": 1, "maximum": 14}, "hourly": {"type": "boolean"}},
  "required": ["city", "unit", "days", "hourly"], "additionalProperties": false}})";

namespace chunkattn {
namespace {

constexpr int kPhases = 5;
constexpr const char* kPhaseNames[kPhases] = {"schedule", "to_wire", "serialize", "result", "complete"};

struct Run {
  std::vector<double> phase_us[kPhases];
  std::vector<double> total_us;
  std::vector<double> spawn_us;  // one thread per rank started and joined
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "chunkattn-step-bench: %s\n", msg.c_str());
  return 2;
}

// The workers' side of a constrained sample: a token the mask allows, drawn
// from (step, sample), a text token when there is one.
void DrawAllowed(const StepPlan& plan, const grammar::Vocabulary& vocab, StepResult* result) {
  std::vector<int32_t> text, stops;
  for (size_t k = 0; k < plan.samples.size(); ++k) {
    const std::vector<uint32_t>& allowed = plan.samples[k].allowed;
    if (allowed.empty()) continue;
    text.clear();
    stops.clear();
    for (size_t w = 0; w < allowed.size(); ++w) {
      for (uint32_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
        const int32_t t = static_cast<int32_t>(w * 32 + __builtin_ctz(bits));
        // Stop tokens and ']' (the array's end) only when nothing else is allowed.
        const bool ends = vocab.is_stop(t) || vocab.token_bytes(t).find(']') != std::string::npos;
        (ends ? stops : text).push_back(t);
      }
    }
    const std::vector<int32_t>& pick = text.empty() ? stops : text;
    const uint64_t h = (plan.step + 1) * 0x9E3779B97F4A7C15ull ^ (k + 1) * 0xBF58476D1CE4E5B9ull;
    result->tokens[k] = pick[(h >> 17) % pick.size()];
  }
}

struct Constraint {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // null: none
  int count = 0;                                            // requests carrying it
};

absl::StatusOr<Run> OneRun(int batch, int shared_len, int question_len, int chunk, int ranks, int steps,
                           const Constraint& constraint, ThreadPool* mask_pool) {
  const int warmup = 8;
  const int max_new = warmup + steps + 8;
  SchedulerOptions so;
  so.chunk_size = chunk;
  const int per_seq = (shared_len + question_len + max_new + chunk - 1) / chunk;
  so.num_chunks = shared_len / chunk + batch * (per_seq - shared_len / chunk + 1) + 64;
  so.max_context = shared_len + question_len + max_new;
  so.max_batch_size = batch;
  so.max_tokens_per_step = std::max(2048, batch);
  so.mask_pool = mask_pool;
  ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::Create(so));
  std::vector<TokenId> shared(shared_len);
  for (int i = 0; i < shared_len; ++i) shared[i] = 3 + (i * 7919) % 31000;
  for (int r = 0; r < batch; ++r) {
    RequestSpec spec;
    spec.prompt = shared;
    for (int k = 0; k < question_len; ++k) spec.prompt.push_back(3 + (r * 131 + k * 17) % 31000);
    spec.max_new_tokens = max_new;
    spec.ignore_eos = true;
    spec.sampling.temperature = 0;
    if (r < constraint.count) spec.constraint = std::make_shared<GrammarConstraint>(constraint.grammar, 1);
    RETURN_IF_ERROR(scheduler->Add(r, std::move(spec)));
  }
  StepPlan plan;
  StepResult result;
  internal::v1::StepPlan wire;
  internal::v1::StepResult wire_result;
  std::string bytes;
  std::vector<SampleEvent> events;
  // Until every request decodes and has produced `warmup` tokens.
  for (int guard = 0;; ++guard) {
    if (guard > 100000) return absl::InternalError("the batch never reached steady decode");
    ASSIGN_OR_RETURN(bool scheduled, scheduler->Schedule(&plan));
    if (!scheduled) return absl::InternalError("nothing scheduled during warm-up");
    const bool steady = plan.prefill.num_tokens() == 0 && static_cast<int>(plan.samples.size()) == batch &&
                        plan.samples[0].step >= static_cast<uint64_t>(warmup);
    NullExecute(plan, &result);
    if (constraint.count > 0) DrawAllowed(plan, *constraint.grammar->vocab(), &result);
    events.clear();
    RETURN_IF_ERROR(scheduler->Complete(result, &events));
    if (steady) break;
  }
  Run run;
  for (int s = 0; s < steps; ++s) {
    absl::Time t[kPhases + 1];
    t[0] = absl::Now();
    ASSIGN_OR_RETURN(bool scheduled, scheduler->Schedule(&plan));
    if (!scheduled || static_cast<int>(plan.samples.size()) != batch) {
      return absl::InternalError("a timed step lost its batch");
    }
    t[1] = absl::Now();
    ToProto(plan, &wire);
    t[2] = absl::Now();
    for (int r = 0; r < ranks; ++r) {
      bytes.clear();
      if (!wire.SerializeToString(&bytes)) return absl::InternalError("serialization failed");
    }
    t[3] = absl::Now();
    NullExecute(plan, &result);  // the workers' side: not timed
    if (constraint.count > 0) DrawAllowed(plan, *constraint.grammar->vocab(), &result);
    ToProto(result, &wire_result);
    const std::string reply = wire_result.SerializeAsString();
    const absl::Time parse_start = absl::Now();
    if (!wire_result.ParseFromString(reply)) return absl::InternalError("parse failed");
    FromProto(wire_result, &result);
    t[4] = absl::Now();
    events.clear();
    RETURN_IF_ERROR(scheduler->Complete(result, &events));
    t[5] = absl::Now();
    const absl::Duration worker_side = parse_start - t[3];
    double total = 0;
    for (int p = 0; p < kPhases; ++p) {
      absl::Duration d = t[p + 1] - t[p];
      if (p == 3) d -= worker_side;
      run.phase_us[p].push_back(absl::ToDoubleMicroseconds(d));
      total += absl::ToDoubleMicroseconds(d);
    }
    run.total_us.push_back(total);
    const absl::Time spawn = absl::Now();
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) threads.emplace_back([] {});
    for (auto& th : threads) th.join();
    run.spawn_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - spawn));
  }
  return run;
}

absl::StatusOr<Constraint> LoadConstraint(int count) {
  Constraint c;
  c.count = count;
  if (count == 0) return c;
  std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) path = bench::FindQwen3Tokenizer();
  if (path.empty()) return absl::NotFoundError("no --tokenizer and no Qwen3 tokenizer.json: run scripts/install-hf-reference.sh");
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadHfTokenizer(path));
  ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Vocabulary> vocab, grammar::Vocabulary::Create(*tokenizer));
  std::string schema = kDefaultSchema;
  if (const std::string file = absl::GetFlag(FLAGS_schema); !file.empty()) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError("cannot read --schema " + file);
    schema.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSIGN_OR_RETURN(c.grammar, grammar::CompileConstraint({grammar::ConstraintKind::kJsonSchema, schema}, vocab));
  return c;
}

int Main(int argc, char** argv) {
  const int batch = absl::GetFlag(FLAGS_batch), shared_len = absl::GetFlag(FLAGS_shared_len);
  const int question_len = absl::GetFlag(FLAGS_question_len), chunk = absl::GetFlag(FLAGS_chunk_size);
  const int ranks = absl::GetFlag(FLAGS_ranks), steps = absl::GetFlag(FLAGS_steps);
  const int repeats = absl::GetFlag(FLAGS_repeats), constrained = absl::GetFlag(FLAGS_constrained);
  if (batch < 1 || shared_len < 0 || question_len < 1 || ranks < 1 || steps < 1 || repeats < 1) {
    return Fail("need --batch, --question_len, --ranks, --steps, --repeats >= 1 and --shared_len >= 0");
  }
  if (constrained < 0 || constrained > batch) return Fail("--constrained must be in [0, --batch]");
  const int mask_threads = absl::GetFlag(FLAGS_mask_threads);
  if (mask_threads < 1 || mask_threads > 64) return Fail("--mask_threads must be in [1, 64]");
  ThreadPool mask_pool(mask_threads);
  absl::StatusOr<Constraint> constraint = LoadConstraint(constrained);
  if (!constraint.ok()) return Fail(constraint.status().ToString());
  // Configurations, interleaved per repeat: the batch as it is, then (with
  // --constrained) with its constraints.
  std::vector<Constraint> configs = {Constraint{}};
  if (constrained > 0) configs.push_back(*constraint);
  const size_t nc = configs.size();
  std::vector<std::vector<double>> run_median(nc * (kPhases + 1)), all_total(nc);
  std::vector<double> spawn_median;
  for (int rep = 0; rep < repeats; ++rep) {
    for (size_t c = 0; c < nc; ++c) {
      absl::StatusOr<Run> run = OneRun(batch, shared_len, question_len, chunk, ranks, steps, configs[c], &mask_pool);
      if (!run.ok()) return Fail(run.status().ToString());
      for (int p = 0; p < kPhases; ++p) run_median[c * (kPhases + 1) + p].push_back(bench::Median(run->phase_us[p]));
      run_median[c * (kPhases + 1) + kPhases].push_back(bench::Median(run->total_us));
      all_total[c].insert(all_total[c].end(), run->total_us.begin(), run->total_us.end());
      if (c == 0) spawn_median.push_back(bench::Median(run->spawn_us));
    }
  }
  std::printf("coordinator cost per decode step: batch %d, shared prefix %d tokens + %d own, chunk %d, "
              "%d ranks; medians of %d runs x %d steps\n",
              batch, shared_len, question_len, chunk, ranks, repeats, steps);
  if (constrained > 0) {
    std::printf("constrained: %d of the %d requests, a JSON schema on %d tokens (%s); masks on %d thread(s)\n",
                constrained, batch, configs[1].grammar->vocab()->vocab_size(),
                absl::GetFlag(FLAGS_schema).empty() ? "built-in" : absl::GetFlag(FLAGS_schema).c_str(), mask_threads);
  }
  std::printf("\n%-10s %14s", "phase", "median us");
  if (nc > 1) std::printf(" %14s %8s", "constrained", "ratio");
  std::printf("\n");
  nlohmann::json row = bench::Provenance(argc, argv);
  row["benchmark"] = "coordinator_step";
  row["batch"] = batch;
  row["shared_len"] = shared_len;
  row["question_len"] = question_len;
  row["chunk_size"] = chunk;
  row["ranks"] = ranks;
  row["steps"] = steps;
  row["repeats"] = repeats;
  row["constrained"] = constrained;
  row["mask_threads"] = mask_threads;
  auto cell = [&](size_t c, int p) { return bench::Median(run_median[c * (kPhases + 1) + p]); };
  for (int p = 0; p <= kPhases; ++p) {
    const std::string name = p < kPhases ? kPhaseNames[p] : "total";
    std::printf("%-10s %14.1f", name.c_str(), cell(0, p));
    row[name + "_us_median"] = cell(0, p);
    if (nc > 1) {
      std::printf(" %14.1f %7.2fx", cell(1, p), cell(1, p) / cell(0, p));
      row["constrained_" + name + "_us_median"] = cell(1, p);
    }
    std::printf("\n");
  }
  const double p99 = bench::Percentile(all_total[0], 99);
  std::printf("total p99  %14.1f", p99);
  row["total_us_p99"] = p99;
  if (nc > 1) {
    const double cp99 = bench::Percentile(all_total[1], 99);
    std::printf(" %14.1f", cp99);
    row["constrained_total_us_p99"] = cp99;
    // What the masks add per constrained row: the schedule phase's growth.
    const double per_row = (cell(1, 0) - cell(0, 0)) / constrained;
    std::printf("\n\nmasks: %.1f us per constrained row per step (schedule's growth / %d rows)", per_row,
                constrained);
    row["mask_us_per_row"] = per_row;
  }
  std::printf("\n");
  const double spawn = bench::Median(spawn_median);
  std::printf("\nremoved: a thread per rank per step would add %.1f us (%d threads started and joined)\n",
              spawn, ranks);
  row["thread_per_rank_us_median"] = spawn;
  bench::JsonArrayFile out(absl::GetFlag(FLAGS_json));
  if (!out.Append(row)) return 1;
  if (!out.path().empty()) std::printf("\nwrote %s\n", out.path().c_str());
  return 0;
}

}  // namespace
}  // namespace chunkattn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return chunkattn::Main(argc, argv);
}
