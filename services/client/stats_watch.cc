#include "services/client/stats_watch.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chunkattn/v1/generation.grpc.pb.h"

namespace chunkattn::client {
namespace {

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

// SIGINT and SIGTERM set g_stop while the watch runs; the previous handlers
// come back after it.
class StopSignals {
 public:
  StopSignals() {
    g_stop = 0;
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

// 1234567 -> "1,234,567": the panel is read at a glance.
std::string Grouped(uint64_t v) {
  std::string digits = absl::StrCat(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? std::string("-") : absl::StrFormat("%.1f%%", 100.0 * part / whole);
}

// used '#', cached '+', free '.', in proportion to the capacity.
std::string Bar(const v1::CacheStats& s, int width) {
  const uint64_t capacity = std::max<uint64_t>(1, s.capacity_chunks());
  auto cells = [&](uint64_t chunks) { return static_cast<int>((chunks * width + capacity / 2) / capacity); };
  const int used = std::min(width, cells(s.used_chunks()));
  const int cached = std::min(width - used, cells(s.cached_chunks()));
  return absl::StrCat("[", std::string(used, '#'), std::string(cached, '+'), std::string(width - used - cached, '.'),
                      "]");
}

}  // namespace

std::string RenderStatsPanel(const std::string& server, const v1::CacheStats& now, const v1::CacheStats* before,
                             double interval_s) {
  std::string out = absl::StrFormat("chunkattn cache at %s, every %.3g s (Ctrl-C to stop)\n", server, interval_s);
  absl::StrAppendFormat(&out, "chunks    %s used %s  cached %s  free %s  of %s\n", Bar(now, 40),
                        Grouped(now.used_chunks()), Grouped(now.cached_chunks()), Grouped(now.free_chunks()),
                        Grouped(now.capacity_chunks()));
  const uint64_t logical = now.logical_tokens(), physical = now.physical_tokens();
  absl::StrAppendFormat(&out, "shared    %s chunks held by 2+ sequences; %s tokens of KV stored as %s (%s saved)\n",
                        Grouped(now.shared_chunks()), Grouped(logical), Grouped(physical),
                        logical > physical ? Percent(logical - physical, logical) : std::string("0.0%"));
  // Interval rates need the same counters one interval apart: a restarted
  // coordinator's counters start over, so skip that refresh's rates.
  const bool rates = before != nullptr && interval_s > 0 &&
                     now.prompt_tokens_total() >= before->prompt_tokens_total() &&
                     now.cached_prompt_tokens_total() >= before->cached_prompt_tokens_total() &&
                     now.generation_tokens_total() >= before->generation_tokens_total();
  std::string recent = "-";
  std::string tokens_per_s = "-";
  if (rates) {
    const uint64_t prompt = now.prompt_tokens_total() - before->prompt_tokens_total();
    const uint64_t cached = now.cached_prompt_tokens_total() - before->cached_prompt_tokens_total();
    recent = prompt == 0 ? std::string("- (no prompts)")
                         : absl::StrCat(Percent(cached, prompt), " (", Grouped(cached), " of ", Grouped(prompt),
                                        " tokens)");
    tokens_per_s = absl::StrFormat("%.1f", (now.generation_tokens_total() - before->generation_tokens_total()) /
                                               interval_s);
  }
  absl::StrAppendFormat(&out, "prompts   hit rate %s over the last interval, %s since start\n", recent,
                        Percent(now.cached_prompt_tokens_total(), now.prompt_tokens_total()));
  absl::StrAppendFormat(&out, "generate  %s tokens/s, %s tokens since start\n", tokens_per_s,
                        Grouped(now.generation_tokens_total()));
  absl::StrAppendFormat(&out, "requests  %s running, %s waiting; %s preemptions, %s chunks evicted since start\n",
                        Grouped(now.running_requests()), Grouped(now.waiting_requests()),
                        Grouped(now.preemptions_total()), Grouped(now.evicted_chunks_total()));
  // The KV tiers below the pool, one line each; loads and their latency over
  // the interval when the same tier was there one interval ago.
  for (const v1::KvTierStats& t : now.tiers()) {
    const v1::KvTierStats* was = nullptr;
    if (rates && before != nullptr) {
      for (const v1::KvTierStats& b : before->tiers()) {
        if (b.tier() == t.tier() && b.loads_total() <= t.loads_total()) was = &b;
      }
    }
    std::string loads = absl::StrCat(Grouped(t.loads_total()), " loads");
    if (was != nullptr) {
      absl::StrAppendFormat(&loads, " (%.1f/s)", (t.loads_total() - was->loads_total()) / interval_s);
    }
    if (t.load_seconds_total() > 0 && t.loads_total() > 0) {
      absl::StrAppendFormat(&loads, ", %.2f ms/load", 1e3 * t.load_seconds_total() / t.loads_total());
    }
    const std::string capacity =
        t.capacity_blocks() > 0 ? absl::StrCat(" of ", Grouped(t.capacity_blocks())) : std::string();
    absl::StrAppendFormat(&out, "%-6s    %s blocks%s (%s MiB); %s hits, %s; %s stores, %s fallbacks, %s drops\n",
                          t.tier(), Grouped(t.blocks()), capacity, Grouped(t.bytes() >> 20), Grouped(t.hits_total()),
                          loads, Grouped(t.stores_total()), Grouped(t.fallbacks_total()), Grouped(t.drops_total()));
  }
  return out;
}

int WatchStats(const WatchOptions& options) {
  StopSignals signals;
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(MakeChannel(options.channel));
  using Clock = std::chrono::steady_clock;
  std::optional<v1::CacheStats> before;
  Clock::time_point last;
  int drawn_lines = 0;
  if (options.redraw) std::fputs("\x1b[?25l", stdout);  // hide the cursor while redrawing
  auto finish = [&](int code) {
    if (options.redraw) std::fputs("\x1b[?25h", stdout);
    std::fflush(stdout);
    return code;
  };
  for (int refresh = 0; g_stop == 0; ++refresh) {
    grpc::ClientContext ctx;
    // Short enough that a server gone quiet ends the watch soon.
    SetDeadline(&ctx, std::clamp(2 * options.interval_s, 2.0, 10.0));
    v1::CacheStats now;
    const grpc::Status status = stub->GetCacheStats(&ctx, v1::GetCacheStatsRequest(), &now);
    if (g_stop != 0) break;
    if (!status.ok()) {
      PrintRpcError(status);
      std::fprintf(stderr, "%s: the server %s; the watch ends\n", options.channel.server.c_str(),
                   refresh == 0 ? "cannot be reached" : "went away");
      return finish(1);
    }
    const Clock::time_point at = Clock::now();
    const double interval = before ? std::chrono::duration<double>(at - last).count() : options.interval_s;
    const std::string panel = RenderStatsPanel(options.channel.server, now, before ? &*before : nullptr,
                                               before ? interval : options.interval_s);
    if (options.redraw) {
      // Back to the panel's first line, clear to the end, draw again.
      if (drawn_lines > 0) std::printf("\x1b[%dA\x1b[J", drawn_lines);
      drawn_lines = static_cast<int>(std::count(panel.begin(), panel.end(), '\n'));
      std::fputs(panel.c_str(), stdout);
    } else {
      std::printf("%s\n", panel.c_str());
    }
    std::fflush(stdout);
    before = now;
    last = at;
    if (options.count > 0 && refresh + 1 >= options.count) break;
    const Clock::time_point next = at + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(options.interval_s));
    while (g_stop == 0 && Clock::now() < next) {
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), next - Clock::now()));
    }
  }
  return finish(0);
}

}  // namespace chunkattn::client
