// KV events: the tracker's stream against the forest itself over seeded
// random walks (a router that applies every event must hold exactly the
// forest's blocks, namespace by namespace), the encoding against fixtures
// written from vLLM's format by an independent encoder (Python msgpack,
// tests/fixtures/kv_events/make_fixtures.py), the hash chain against
// cbor2 + hashlib, and the publisher's ZMQ sockets through a real subscriber
// and replay client on 127.0.0.1: vLLM's frames, CURVE (only admitted keys
// hear anything), replies in bounded batches that a client resumes, and a
// flood of replay requests that leaves memory bounded.
#include <malloc.h>
#include <unistd.h>
#include <zmq.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "base/sanitizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/kv_events/block_hash.h"
#include "services/kv_events/curve.h"
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
  c.steps = SanitizerSlice(c.steps, 8);  // each step rebuilds the index: slow under a sanitizer
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
  const std::string pool_medium = j.at("medium").get<std::string>();
  for (const auto& e : j.at("events")) {
    KvEvent ev;
    const std::string type = e.at("type").get<std::string>();
    // An event's own medium names a tier below the pool.
    const std::string medium = e.value("medium", pool_medium);
    ev.tier = -1;
    for (int t = kKvPoolTier; t <= kKvMaxTier; ++t) {
      if (KvTierMedium(t, pool_medium) == medium) ev.tier = t;
    }
    EXPECT_GE(ev.tier, 0) << "unknown medium " << medium;
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
    // A DEALER with no peer yet (or one whose handshake fails) blocks a send.
    zmq_setsockopt(socket, ZMQ_SNDTIMEO, &timeout_ms, sizeof(timeout_ms));
  }
  ~Client() {
    zmq_close(socket);
    zmq_ctx_term(context);
  }
  // CURVE towards a server whose public key is `server_key`, as `own`.
  void Curve(const std::string& server_key, const CurveKeyPair& own) {
    ASSERT_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, server_key.data(), server_key.size()), 0);
    ASSERT_EQ(zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, own.public_key.data(), own.public_key.size()), 0);
    ASSERT_EQ(zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, own.secret_key.data(), own.secret_key.size()), 0);
  }
  void SetTimeout(int ms) {
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &ms, sizeof(ms));
    zmq_setsockopt(socket, ZMQ_SNDTIMEO, &ms, sizeof(ms));
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
  o.allow_plaintext_remote = true;
  auto a = KvEventPublisher::Create(o).value();
  // A port another publisher has bound.
  o.endpoint = "tcp://*:" + a->bound_endpoint().substr(a->bound_endpoint().rfind(':') + 1);
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoint = "tcp://*:*";
  o.replay_batches_per_request = 0;
  EXPECT_EQ(KvEventPublisher::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

uint64_t SeqOf(const std::string& frame) {
  uint64_t v = 0;
  for (unsigned char ch : frame) v = (v << 8) | ch;
  return v;
}

// Asks for the batches from `from`; the seqs of the reply, up to its end
// marker (nullopt: no end marker came within the client's timeout).
std::optional<std::vector<uint64_t>> AskReplay(Client& dealer, uint64_t from) {
  const std::string start = SeqFrame(from);
  if (zmq_send(dealer.socket, "", 0, ZMQ_SNDMORE) != 0 || zmq_send(dealer.socket, start.data(), 8, 0) != 8) {
    return std::nullopt;
  }
  std::vector<uint64_t> seqs;
  for (;;) {
    const std::vector<std::string> m = dealer.Receive();
    if (m.size() != 4) return std::nullopt;
    if (m[3].empty()) return m[2] == std::string(8, '\xff') ? std::optional(seqs) : std::nullopt;
    seqs.push_back(SeqOf(m[2]));
  }
}

// A wildcard host is an explicit choice: CURVE or allow_plaintext_remote.
// Loopback binds (vLLM would connect to it), at the port named.
TEST(KvEventPublisherTest, WildcardHostNeedsCurveOrConsent) {
  for (const char* wildcard : {"tcp://*:*", "tcp://0.0.0.0:*", "tcp://[::]:*"}) {
    KvEventPublisherOptions o;
    o.endpoint = wildcard;
    absl::Status s = KvEventPublisher::Create(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << wildcard;
    EXPECT_NE(s.message().find("--kv_events_endpoint: "), std::string::npos) << s;
    EXPECT_NE(s.message().find("--kv_events_allow_plaintext_remote"), std::string::npos) << s;
    o.endpoint = "tcp://127.0.0.1:*";
    o.replay_endpoint = wildcard;
    s = KvEventPublisher::Create(o).status();
    EXPECT_NE(s.message().find("--kv_events_replay_endpoint: "), std::string::npos) << s;
    o.endpoint = wildcard;
    o.allow_plaintext_remote = true;
    auto plain = KvEventPublisher::Create(o);
    ASSERT_TRUE(plain.ok()) << wildcard << ": " << plain.status();
    EXPECT_FALSE((*plain)->bound_replay_endpoint().empty());
    o.allow_plaintext_remote = false;
    o.curve_secret_key = GenerateCurveKeyPair().value().secret_key;
    auto curve = KvEventPublisher::Create(o);
    ASSERT_TRUE(curve.ok()) << wildcard << ": " << curve.status();
  }
  // Loopback is bound: a second publisher on the same port finds it taken.
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  auto first = KvEventPublisher::Create(o).value();
  o.endpoint = first->bound_endpoint();
  auto again = KvEventPublisher::Create(o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("cannot bind"), std::string::npos) << again.status();
}

TEST(KvEventPublisherTest, CurveOptionsAreChecked) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.curve_secret_key = "not a key";
  absl::Status s = KvEventPublisher::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--kv_events_curve_secret_key_file"), std::string::npos) << s;
  o.curve_secret_key = GenerateCurveKeyPair().value().secret_key;
  o.curve_client_keys = {GenerateCurveKeyPair().value().public_key, std::string(40, ' ')};
  s = KvEventPublisher::Create(o).status();
  EXPECT_NE(s.message().find("--kv_events_curve_client_keys_file: key 2"), std::string::npos) << s;
  o.curve_secret_key.clear();
  o.curve_client_keys.resize(1);
  s = KvEventPublisher::Create(o).status();
  EXPECT_NE(s.message().find("needs --kv_events_curve_secret_key_file"), std::string::npos) << s;
  o.endpoint.clear();
  o.curve_client_keys.clear();
  o.curve_secret_key = GenerateCurveKeyPair().value().secret_key;
  s = KvEventPublisher::Create(o).status();
  EXPECT_NE(s.message().find("needs --kv_events_endpoint"), std::string::npos) << s;
}

TEST(CurveKeysTest, KeypairsAndKeyFiles) {
  ASSERT_TRUE(CurveAvailable());
  const CurveKeyPair pair = GenerateCurveKeyPair().value();
  EXPECT_TRUE(IsZ85Key(pair.public_key));
  EXPECT_TRUE(IsZ85Key(pair.secret_key));
  EXPECT_EQ(CurvePublicKey(pair.secret_key).value(), pair.public_key);
  EXPECT_FALSE(IsZ85Key(pair.public_key.substr(1)));
  EXPECT_FALSE(IsZ85Key(std::string(40, '~')));  // not in the alphabet
  EXPECT_FALSE(IsZ85Key(std::string(40, '#')));  // 5-character groups worth more than 2^32

  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  const CurveKeyPair other = GenerateCurveKeyPair().value();
  EXPECT_EQ(ReadCurveKeyFile(write("one.key", "\n  " + pair.secret_key + "  \n\n"), "--f").value(), pair.secret_key);
  EXPECT_EQ(ReadCurveKeysFile(write("two.keys", pair.public_key + "\n" + other.public_key), "--f").value(),
            (std::vector<std::string>{pair.public_key, other.public_key}));
  struct Bad {
    std::string text, message;
  };
  for (const Bad& bad : {Bad{"", "holds no key"}, Bad{pair.public_key + "\n" + other.public_key, "holds 2 keys"},
                         Bad{pair.secret_key + "\npublic_key=" + pair.public_key, "line 2 is not a Z85"}}) {
    const absl::Status s = ReadCurveKeyFile(write("bad.key", bad.text), "--kv_events_curve_secret_key_file").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.text;
    EXPECT_NE(s.message().find("--kv_events_curve_secret_key_file: "), std::string::npos) << s;
    EXPECT_NE(s.message().find(bad.message), std::string::npos) << s;
    EXPECT_EQ(s.message().find(pair.secret_key), std::string::npos) << "a secret in an error";
  }
  const absl::Status missing = ReadCurveKeyFile(dir + "/missing.key", "--f").status();
  EXPECT_NE(missing.message().find("--f: cannot open"), std::string::npos) << missing;
}

// With CURVE and client keys, a client that knows the server's public key
// and holds an admitted key hears the events and gets replays; a plaintext
// client and one with another key hear nothing, though they connected first.
TEST(KvEventPublisherTest, CurveAdmitsOnlyKnownClients) {
  const CurveKeyPair server = GenerateCurveKeyPair().value();
  const CurveKeyPair admitted = GenerateCurveKeyPair().value();
  const CurveKeyPair stranger = GenerateCurveKeyPair().value();
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@curve@model";
  o.curve_secret_key = server.secret_key;
  o.curve_client_keys = {admitted.public_key};
  auto publisher = KvEventPublisher::Create(o).value();

  Client plain(ZMQ_SUB), other(ZMQ_SUB), sub(ZMQ_SUB);
  other.Curve(server.public_key, stranger);
  sub.Curve(server.public_key, admitted);
  for (Client* c : {&plain, &other, &sub}) {
    ASSERT_EQ(zmq_setsockopt(c->socket, ZMQ_SUBSCRIBE, "", 0), 0);
    ASSERT_EQ(zmq_connect(c->socket, publisher->bound_endpoint().c_str()), 0);
  }
  sub.SetTimeout(100);
  std::vector<std::string> first;
  for (int i = 0; i < 100 && first.empty(); ++i) {
    publisher->Publish(Removal(1 + i));
    first = sub.Receive();
  }
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], "kv@curve@model");
  sub.SetTimeout(5000);
  for (int i = 0; i < 3; ++i) publisher->Publish(Removal(500 + i));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sub.Receive().size(), 3u);
  for (Client* c : {&plain, &other}) {
    c->SetTimeout(300);
    EXPECT_TRUE(c->Receive().empty());
  }
  for (int i = 0; i < 50 && publisher->stats().curve_denied == 0; ++i) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_GE(publisher->stats().curve_denied, 1);  // the stranger's key, at the handshake

  Client dealer(ZMQ_DEALER), stranger_dealer(ZMQ_DEALER);
  dealer.Curve(server.public_key, admitted);
  stranger_dealer.Curve(server.public_key, stranger);
  ASSERT_EQ(zmq_connect(dealer.socket, publisher->bound_replay_endpoint().c_str()), 0);
  ASSERT_EQ(zmq_connect(stranger_dealer.socket, publisher->bound_replay_endpoint().c_str()), 0);
  const std::optional<std::vector<uint64_t>> replayed = AskReplay(dealer, 0);
  ASSERT_TRUE(replayed.has_value());
  EXPECT_EQ(replayed->size(), publisher->next_seq());
  stranger_dealer.SetTimeout(300);
  // A DEALER queues the request until a handshake succeeds, which never happens.
  EXPECT_FALSE(AskReplay(stranger_dealer, 0).has_value());
}

// A reply carries at most replay_batches_per_request batches; asking again
// from the last one + 1 reaches the end (an empty reply), every batch once,
// in order, even through a peer queue of 2 messages.
TEST(KvEventPublisherTest, ReplayIsBoundedAndResumes) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@bounded@model";
  o.buffer_steps = 100;
  o.replay_batches_per_request = 10;
  o.replay_peer_queue = 2;
  auto publisher = KvEventPublisher::Create(o).value();
  for (uint64_t h = 1; h <= 35; ++h) publisher->Publish(Removal(h));

  Client dealer(ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer.socket, publisher->bound_replay_endpoint().c_str()), 0);
  std::vector<uint64_t> all;
  std::vector<size_t> sizes;
  uint64_t from = 0;
  for (int i = 0; i < 10; ++i) {
    const std::optional<std::vector<uint64_t>> reply = AskReplay(dealer, from);
    ASSERT_TRUE(reply.has_value()) << "reply " << i;
    sizes.push_back(reply->size());
    if (reply->empty()) break;
    all.insert(all.end(), reply->begin(), reply->end());
    from = reply->back() + 1;
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{10, 10, 10, 5, 0}));
  std::vector<uint64_t> expected(35);
  for (uint64_t s = 0; s < 35; ++s) expected[s] = s;
  EXPECT_EQ(all, expected);
  const KvEventPublisher::Stats stats = publisher->stats();
  EXPECT_EQ(stats.replay_requests, 5);
  EXPECT_EQ(stats.replay_batches, 35);
  EXPECT_EQ(stats.replay_refused, 0);
}

// Under a sanitizer, shadow memory and quarantines: RSS says nothing; the bounds are checked.
constexpr bool kSanitized = kSanitizerBuild;

// The process's resident memory, bytes, once glibc has handed back what is
// free (it keeps freed small blocks in its arenas otherwise, which would
// hide whether anything is still held).
int64_t ResidentBytes() {
  if (!kSanitized) malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The attack of issue 37: 200 DEALERs send 50 replay requests each and read
// nothing. Each used to get the whole ring (here 2000 batches of ~2 KB, so
// 8 GB queued in all); now at most max_replays replies are in progress, one
// per peer, each queued only as far as replay_peer_queue, and the rest are
// refused. Memory (this process holds the DEALERs' side too) grows by tens
// of MB at most, all of it back once the DEALERs are gone, and a reader is
// then served in full again.
TEST(KvEventPublisherTest, ReplayFloodLeavesMemoryBounded) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@flood@model";
  o.buffer_steps = 2000;
  auto publisher = KvEventPublisher::Create(o).value();
  for (int b = 0; b < 2000; ++b) {
    KvEvent e;
    e.kind = KvEvent::Kind::kBlockStored;
    e.block_hashes = {static_cast<uint64_t>(b + 1)};
    e.block_size = 400;
    for (int t = 0; t < 400; ++t) e.token_ids.push_back(100000 + t);  // 5 msgpack bytes each
    publisher->Publish({e});
  }
  auto read_in_full = [&] {
    Client reader(ZMQ_DEALER);
    zmq_connect(reader.socket, publisher->bound_replay_endpoint().c_str());
    // Busy (every reply slot taken) is an empty reply: ask again.
    for (int i = 0; i < 600; ++i) {
      const std::optional<std::vector<uint64_t>> reply = AskReplay(reader, 0);
      if (!reply.has_value()) return size_t{0};
      if (!reply->empty()) return reply->size();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return size_t{0};
  };
  ASSERT_EQ(read_in_full(), 1000u);  // warms every allocator the replies use
  const int64_t before = ResidentBytes();
  const int64_t requests_before = publisher->stats().replay_requests;

  constexpr int kPeers = 200, kRequests = 50;
  {
    void* context = zmq_ctx_new();
    std::vector<void*> dealers;
    for (int i = 0; i < kPeers; ++i) {
      void* d = zmq_socket(context, ZMQ_DEALER);
      const int linger = 0, rcvhwm = 1;  // this process's side holds little of what comes
      zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
      zmq_setsockopt(d, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
      ASSERT_EQ(zmq_connect(d, publisher->bound_replay_endpoint().c_str()), 0);
      dealers.push_back(d);
    }
    const std::string start = SeqFrame(0);
    for (int r = 0; r < kRequests; ++r) {
      for (void* d : dealers) {
        ASSERT_EQ(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
        ASSERT_EQ(zmq_send(d, start.data(), 8, 0), 8);
      }
    }
    // Every request read (a bound on the wait, not on the speed).
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (publisher->stats().replay_requests < requests_before + kPeers * kRequests && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    const KvEventPublisher::Stats flood = publisher->stats();
    ASSERT_EQ(flood.replay_requests, requests_before + kPeers * kRequests);
    EXPECT_LE(flood.replays_in_progress, o.max_replays);
    // A peer's requests beyond its reply in progress, and everyone's beyond
    // max_replays, were refused.
    EXPECT_GT(flood.replay_refused, kPeers * kRequests / 2);
    const int64_t during = ResidentBytes();
    std::fprintf(stderr, "RSS %.1f MB before the flood, %.1f MB with it queued; %lld replies in progress\n",
                 before / 1e6, during / 1e6, static_cast<long long>(flood.replays_in_progress));
    if (!kSanitized) {
      EXPECT_LT(during - before, int64_t{64} << 20);
    }
    for (void* d : dealers) zmq_close(d);
    zmq_ctx_term(context);
  }
  // The DEALERs are gone: their replies are dropped, a reader is served.
  EXPECT_EQ(read_in_full(), 1000u);
  for (int i = 0; i < 100 && publisher->stats().replays_in_progress > 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(publisher->stats().replays_in_progress, 0);
  const int64_t after = ResidentBytes();
  std::fprintf(stderr, "RSS %.1f MB after the flood\n", after / 1e6);
  if (!kSanitized) {
    EXPECT_LT(after - before, int64_t{16} << 20);
  }
}

}  // namespace
}  // namespace chunkattn
