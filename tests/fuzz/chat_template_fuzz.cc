// A chat template from arbitrary bytes (tokenizer_config.json is a file from
// outside): ChatTemplate::Parse accepts or refuses it, and what it accepts
// renders a fixed conversation within small limits, or fails with a status:
// never a crash, a hang or unbounded memory. Rendering twice gives the same.
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "text/chat_template.h"

namespace {

using chunkattn::fuzz::Fail;

const nlohmann::ordered_json& Context() {
  static const nlohmann::ordered_json* context = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi é😀 "},
                 {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
                 {"role": "tool", "content": "{\"ok\": 1}", "tool_call_id": "c1"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})"));
  return *context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;  // templates are a few KiB; longer inputs only slow the search
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<chunkattn::ChatTemplate> parsed = chunkattn::ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("chat_template_fuzz", "a parse error that is not INVALID_ARGUMENT");
    }
    return 0;
  }
  chunkattn::ChatTemplate::Limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 200000;
  limits.max_depth = 100;
  const absl::StatusOr<std::string> first = parsed->Render(Context(), limits);
  if (!first.ok()) {
    if (first.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("chat_template_fuzz", "a render error that is not INVALID_ARGUMENT");
    }
    return 0;
  }
  if (first->size() > limits.max_output_bytes) Fail("chat_template_fuzz", "output over the limit");
  const absl::StatusOr<std::string> second = parsed->Render(Context(), limits);
  // strftime_now may tick between the two; anything else must repeat.
  if (source.find("strftime_now") == std::string_view::npos && (!second.ok() || *second != *first)) {
    Fail("chat_template_fuzz", "rendering twice gave different results");
  }
  return 0;
}
