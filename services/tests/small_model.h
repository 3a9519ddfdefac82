// What the fronts' request tests check against: a small model's config, and
// the shape every refusal is checked for.
#ifndef CHUNKATTN_SERVICES_TESTS_SMALL_MODEL_H_
#define CHUNKATTN_SERVICES_TESTS_SMALL_MODEL_H_

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "proto/model/model_config.h"

namespace chunkattn::testing {

// A vocabulary of 100 tokens (EOS 2) and a context of 64.
inline ModelConfig SmallModelConfig() {
  ModelConfig config;
  config.vocab_size = 100;
  config.max_context = 64;
  config.eos_token_ids = {2};
  return config;
}

// INVALID_ARGUMENT whose message starts with `message`.
inline void ExpectRefusal(const absl::Status& status, absl::string_view message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), message)) << status.message() << "\nwanted: " << message;
}

}  // namespace chunkattn::testing

#endif  // CHUNKATTN_SERVICES_TESTS_SMALL_MODEL_H_
