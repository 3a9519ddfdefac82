// `chunkattn stats --watch`: a live terminal view of a coordinator's prefix
// cache for users without Grafana at hand. Polls GetCacheStats every
// interval and redraws one panel in place (on a terminal; elsewhere each
// refresh is printed as its own block): chunks used / cached / free with a
// bar, chunks shared, memory saved by sharing, the prompt hit rate over the
// last interval and since start, generation tokens/s, requests running and
// waiting.
//
// Ends on Ctrl-C (SIGINT or SIGTERM: exit 0, the cursor restored), after
// `count` refreshes, or when the server goes away (exit 1 with the RPC's
// error). Runs on the calling thread; installs its own signal handlers for
// the duration.
#ifndef CHUNKATTN_SERVICES_CLIENT_STATS_WATCH_H_
#define CHUNKATTN_SERVICES_CLIENT_STATS_WATCH_H_

#include <string>

#include "chunkattn/v1/generation.pb.h"
#include "services/client/client.h"

namespace chunkattn::client {

struct WatchOptions {
  ChannelOptions channel;
  double interval_s = 1.0;  // in [0.05, 3600]
  int count = 0;            // refreshes before exiting; 0 = until Ctrl-C
  bool redraw = true;       // redraw in place (a terminal); false: one block per refresh
};

// The panel for `now`, with rates over the `interval_s` since `before`
// (null for the first refresh). Pure: what the watch prints.
std::string RenderStatsPanel(const std::string& server, const v1::CacheStats& now, const v1::CacheStats* before,
                             double interval_s);

// The watch loop; returns the process exit code.
// REQUIRES: options validated (interval and count in range).
int WatchStats(const WatchOptions& options);

}  // namespace chunkattn::client

#endif  // CHUNKATTN_SERVICES_CLIENT_STATS_WATCH_H_
