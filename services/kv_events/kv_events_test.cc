// KV events: the tracker's stream against the forest itself over seeded
// random walks (a router that applies every event must hold exactly the
// forest's blocks, namespace by namespace), the encoding against fixtures
// written from vLLM's format by an independent encoder (Python msgpack,
// tests/fixtures/kv_events/make_fixtures.py), the hash chain against
// cbor2 + hashlib, and the publisher's ZMQ sockets through a real subscriber
// and replay client on 127.0.0.1.
#include <zmq.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/kv_events/block_hash.h"
#include "services/kv_events/kv_events.h"
#include "services/kv_events/publisher.h"
#include "services/tests/forest_walk.h"
#include "services/tests/kv_event_index.h"

namespace chunkattn {
namespace {

using testing::WalkCase;

class KvEventWalkTest : public ::testing::TestWithParam<WalkCase> {};

// After every operation of the walk (inserts with cancelled prefills,
// appends with copy-on-write, forks, removes, evictions under a tiny pool,
// several namespaces), the index built from the events equals the forest's
// blocks recomputed from the tree alone.
TEST_P(KvEventWalkTest, RouterIndexEqualsForestBlocks) {
  WalkCase c = GetParam();
  c.params.record_block_events = true;
  std::mt19937 rng(c.seed);
  testing::RandomWalk walk(c.params, [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); });
  KvEventTracker tracker(c.params.chunk_size, "0");
  testing::RouterIndex index;
  int64_t stored = 0, removed = 0, max_blocks = 0;
  for (int step = 0; step < c.steps && !HasFailure(); ++step) {
    walk.Step();
    std::vector<KvEvent> events;
    tracker.Convert(walk.TakeBlockEvents(), &events);
    for (const KvEvent& e : events) {
      (e.kind == KvEvent::Kind::kBlockStored ? stored : removed) += static_cast<int64_t>(e.block_hashes.size());
    }
    index.Apply(events, c.params.chunk_size);
    ASSERT_EQ(index.ByNamespace(), testing::ForestBlocks(walk.forest(), "0")) << "step " << step;
    ASSERT_EQ(tracker.num_blocks(), static_cast<int64_t>(ListBlocks(walk.forest(), "0").size()));
    max_blocks = std::max(max_blocks, tracker.num_blocks());
  }
  if (HasFailure()) return;
  walk.Finish();  // evicts everything
  std::vector<KvEvent> events;
  tracker.Convert(walk.TakeBlockEvents(), &events);
  index.Apply(events, c.params.chunk_size);
  EXPECT_TRUE(index.ByNamespace().empty());
  EXPECT_EQ(tracker.num_blocks(), 0);
  // The walk did exercise the stream.
  EXPECT_GT(stored, c.steps / 20);
  EXPECT_GT(removed, c.steps / 50);
  EXPECT_GT(max_blocks, 3);
}

INSTANTIATE_TEST_SUITE_P(Walks, KvEventWalkTest,
                         ::testing::Values(WalkCase{{16, 48}, 20000, 11}, WalkCase{{32, 40}, 10000, 12},
                                           WalkCase{{16, 200}, 10000, 13}),
                         [](const ::testing::TestParamInfo<WalkCase>& info) {
                           return "c" + std::to_string(info.param.params.chunk_size) + "_pool" +
                                  std::to_string(info.param.params.pool_chunks);
                         });

TEST(KvEventTrackerTest, SaltOnBlockZeroOnlyAndNamespacesHashApart) {
  const int c = 16;
  auto forest = PrefixForest::Create({c, 16, 4096}).value();
  forest->set_record_block_events(true);
  std::vector<TokenId> prompt(2 * c + 5);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(i + 3);
  const SeqId a = forest->Insert(prompt, "tenant-a").value().seq_id;
  const SeqId b = forest->Insert(prompt, "").value().seq_id;
  ASSERT_TRUE(forest->MarkComputed(a).ok());
  ASSERT_TRUE(forest->MarkComputed(b).ok());
  KvEventTracker tracker(c, "0");
  std::vector<KvEvent> events;
  tracker.Convert(forest->TakeBlockEvents(), &events);
  // One run of two full blocks per sequence (the partial tail is not a block).
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].cache_salt, "tenant-a");
  EXPECT_EQ(events[1].cache_salt, "");
  for (const KvEvent& e : events) {
    EXPECT_EQ(e.kind, KvEvent::Kind::kBlockStored);
    EXPECT_FALSE(e.parent_block_hash.has_value());
    EXPECT_EQ(e.block_hashes.size(), 2u);
    EXPECT_EQ(e.token_ids, std::vector<int32_t>(prompt.begin(), prompt.begin() + 2 * c));
  }
  EXPECT_NE(events[0].block_hashes[0], events[1].block_hashes[0]);
  EXPECT_NE(events[0].block_hashes[1], events[1].block_hashes[1]);
  // The hash is the chain of block_hash.h.
  const BlockDigest d0 = ChainDigest(NoneDigest("0"), absl::MakeConstSpan(prompt).first(c), "");
  EXPECT_EQ(events[1].block_hashes[0], PublishedHash(d0));
  EXPECT_EQ(events[1].block_hashes[1], PublishedHash(ChainDigest(d0, absl::MakeConstSpan(prompt).subspan(c, c), "")));
  tracker.Clear(&events);
  EXPECT_EQ(events.back().kind, KvEvent::Kind::kAllBlocksCleared);
  EXPECT_EQ(tracker.num_blocks(), 0);
}

// --- The wire format against the fixtures ----------------------------------

std::string FixtureDir() {
  const char* dir = std::getenv("CHUNKATTN_KV_EVENT_FIXTURES");
  return dir != nullptr ? dir : "tests/fixtures/kv_events";
}

std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

KvEventBatch BatchFromJson(const nlohmann::json& j) {
  KvEventBatch batch;
  batch.ts = j.at("ts").get<double>();
  for (const auto& e : j.at("events")) {
    KvEvent ev;
    const std::string type = e.at("type").get<std::string>();
    if (type == "BlockStored") {
      ev.kind = KvEvent::Kind::kBlockStored;
      ev.block_hashes = e.at("block_hashes").get<std::vector<uint64_t>>();
      if (!e.at("parent_block_hash").is_null()) ev.parent_block_hash = e.at("parent_block_hash").get<uint64_t>();
      ev.token_ids = e.at("token_ids").get<std::vector<int32_t>>();
      ev.block_size = e.at("block_size").get<int32_t>();
      ev.cache_salt = e.value("cache_salt", "");
    } else if (type == "BlockRemoved") {
      ev.kind = KvEvent::Kind::kBlockRemoved;
      ev.block_hashes = e.at("block_hashes").get<std::vector<uint64_t>>();
    } else {
      EXPECT_EQ(type, "AllBlocksCleared");
      ev.kind = KvEvent::Kind::kAllBlocksCleared;
    }
    batch.events.push_back(std::move(ev));
  }
  return batch;
}

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(KvEventFormatTest, EncodingEqualsFixtures) {
  int checked = 0;
  std::map<std::string, int> formats;
  for (const auto& entry : std::filesystem::directory_iterator(FixtureDir())) {
    const std::filesystem::path path = entry.path();
    if (path.extension() != ".msgpack") continue;
    std::filesystem::path json_path = path;
    json_path.replace_extension(".json");
    const nlohmann::json j = nlohmann::json::parse(ReadBytes(json_path));
    const KvEventFormat format = ParseKvEventFormat(j.at("format").get<std::string>()).value();
    const std::string got = EncodeKvEventBatch(BatchFromJson(j), format, j.at("medium").get<std::string>());
    EXPECT_EQ(Hex(got), Hex(ReadBytes(path))) << path;
    ++formats[j.at("format").get<std::string>()];
    ++checked;
  }
  EXPECT_GE(checked, 6) << "fixtures missing in " << FixtureDir();
  EXPECT_GT(formats["map"], 0);
  EXPECT_GT(formats["array"], 0);
}

TEST(KvEventFormatTest, HashChainEqualsCbor2AndHashlib) {
  const nlohmann::json j = nlohmann::json::parse(ReadBytes(std::filesystem::path(FixtureDir()) / "hashes.json"));
  int checked = 0;
  for (const auto& c : j.at("cases")) {
    const std::string salt = c.at("salt").get<std::string>();
    BlockDigest parent = NoneDigest(c.at("seed").get<std::string>());
    const auto blocks = c.at("blocks").get<std::vector<std::vector<int32_t>>>();
    const auto hashes = c.at("hashes").get<std::vector<uint64_t>>();
    ASSERT_EQ(blocks.size(), hashes.size());
    for (size_t k = 0; k < blocks.size(); ++k) {
      parent = ChainDigest(parent, blocks[k], k == 0 ? salt : "");
      EXPECT_EQ(PublishedHash(parent), hashes[k]) << "case " << checked << " block " << k;
    }
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(KvEventFormatTest, ParseFormat) {
  EXPECT_EQ(ParseKvEventFormat("map").value(), KvEventFormat::kMap);
  EXPECT_EQ(ParseKvEventFormat("array").value(), KvEventFormat::kArray);
  EXPECT_EQ(ParseKvEventFormat("json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvEventFormat("").status().code(), absl::StatusCode::kInvalidArgument);
}

// --- The publisher's sockets ------------------------------------------------

// A ZMQ socket of a test client, closed with its context.
struct Client {
  void* context = zmq_ctx_new();
  void* socket = nullptr;
  explicit Client(int type) {
    socket = zmq_socket(context, type);
    const int linger = 0, timeout_ms = 5000;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  }
  ~Client() {
    zmq_close(socket);
    zmq_ctx_term(context);
  }
  // One multipart message; empty when nothing came within the timeout.
  std::vector<std::string> Receive() {
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, socket, 0) < 0) {
        zmq_msg_close(&msg);
        return {};
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    return frames;
  }
};

std::string SeqFrame(uint64_t seq) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(seq >> (8 * (7 - i)));
  return b;
}

std::vector<KvEvent> Removal(uint64_t hash) {
  KvEvent e;
  e.kind = KvEvent::Kind::kBlockRemoved;
  e.block_hashes = {hash};
  return {e};
}

TEST(KvEventPublisherTest, PublishesAndReplaysInVllmsFrames) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@test@model";
  o.buffer_steps = 3;
  auto publisher = KvEventPublisher::Create(o).value();
  ASSERT_FALSE(publisher->bound_endpoint().empty());
  ASSERT_NE(publisher->bound_endpoint(), o.endpoint);  // the port was resolved

  Client sub(ZMQ_SUB);
  ASSERT_EQ(zmq_setsockopt(sub.socket, ZMQ_SUBSCRIBE, "kv@", 3), 0);
  ASSERT_EQ(zmq_connect(sub.socket, publisher->bound_endpoint().c_str()), 0);
  // A SUB misses what is sent before its subscription reaches the PUB (the
  // slow joiner): publish until one arrives, as a consumer would then replay.
  const int short_ms = 100, long_ms = 5000;
  zmq_setsockopt(sub.socket, ZMQ_RCVTIMEO, &short_ms, sizeof(short_ms));
  std::vector<std::string> first;
  for (int i = 0; i < 100 && first.empty(); ++i) {
    publisher->Publish(Removal(100 + i));
    first = sub.Receive();
  }
  zmq_setsockopt(sub.socket, ZMQ_RCVTIMEO, &long_ms, sizeof(long_ms));
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], "kv@test@model");
  const uint64_t seq0 = [&] {
    uint64_t v = 0;
    for (unsigned char ch : first[1]) v = (v << 8) | ch;
    return v;
  }();
  EXPECT_EQ(first[2], EncodeKvEventBatch(*publisher->Since(seq0).front(), KvEventFormat::kMap, "GPU"));
  publisher->Publish({});  // nothing: no batch
  publisher->Publish(Removal(7));
  const std::vector<std::string> next = sub.Receive();
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[1], SeqFrame(seq0 + 1));
  const uint64_t last = publisher->next_seq() - 1;

  // Replay from the start: only the last buffer_steps batches are kept. (The
  // publisher thread sends what was published before it reads a request.)
  Client dealer(ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer.socket, publisher->bound_replay_endpoint().c_str()), 0);
  const std::string from = SeqFrame(0);
  ASSERT_EQ(zmq_send(dealer.socket, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(dealer.socket, from.data(), from.size(), 0), 8);
  std::vector<uint64_t> replayed;
  for (int i = 0; i < 10; ++i) {
    // A DEALER gets the ROUTER's frames less the identity: [empty, topic, seq, payload].
    const std::vector<std::string> m = dealer.Receive();
    ASSERT_EQ(m.size(), 4u) << "reply " << i;
    EXPECT_EQ(m[0], "");
    if (m[3].empty()) {  // the end marker: [empty, empty, 0xFF x 8, empty]
      EXPECT_EQ(m[1], "");
      EXPECT_EQ(m[2], std::string(8, '\xff'));
      break;
    }
    EXPECT_EQ(m[1], "kv@test@model");
    uint64_t v = 0;
    for (unsigned char ch : m[2]) v = (v << 8) | ch;
    replayed.push_back(v);
  }
  std::vector<uint64_t> expected;
  for (uint64_t s = last >= 2 ? last - 2 : 0; s <= last; ++s) expected.push_back(s);
  EXPECT_EQ(replayed, expected);
  EXPECT_EQ(publisher->stats().replay_requests, 1);

  // A malformed request (a 3-byte start) is ignored; the socket still serves.
  ASSERT_EQ(zmq_send(dealer.socket, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(dealer.socket, "abc", 3, 0), 3);
  const std::string from_last = SeqFrame(last);
  ASSERT_EQ(zmq_send(dealer.socket, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(dealer.socket, from_last.data(), 8, 0), 8);
  const std::vector<std::string> one = dealer.Receive();
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(one[2], SeqFrame(last));
  const std::vector<std::string> end = dealer.Receive();
  ASSERT_EQ(end.size(), 4u);
  EXPECT_EQ(end[3], "");
}

TEST(KvEventPublisherTest, InProcessOnlyAndBadOptions) {
  KvEventPublisherOptions o;
  o.buffer_steps = 2;
  auto publisher = KvEventPublisher::Create(o).value();  // no sockets
  EXPECT_FALSE(publisher->WaitFor(0, absl::Milliseconds(1)));
  for (uint64_t h = 1; h <= 3; ++h) publisher->Publish(Removal(h));
  EXPECT_TRUE(publisher->WaitFor(2, absl::ZeroDuration()));
  const auto kept = publisher->Since(0);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0]->seq, 1u);
  EXPECT_EQ(kept[1]->events[0].block_hashes[0], 3u);
  EXPECT_TRUE(publisher->Since(3).empty());

  o.buffer_steps = 0;
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.buffer_steps = kMaxKvEventBufferSteps + 1;
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.buffer_steps = 10;
  o.replay_endpoint = "tcp://127.0.0.1:*";
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoint = o.replay_endpoint = "ipc:///nonexistent/kv";  // refused before any bind
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.replay_endpoint.clear();
  o.endpoint = "not-a-transport://x";
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoint = "tcp://*:*";
  auto a = KvEventPublisher::Create(o).value();
  // A port another publisher has bound.
  o.endpoint = "tcp://*:" + a->bound_endpoint().substr(a->bound_endpoint().rfind(':') + 1);
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chunkattn
