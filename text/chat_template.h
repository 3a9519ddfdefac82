// Chat templates: the Jinja programs Hugging Face models ship
// (tokenizer_config.json's "chat_template", or chat_template.jinja) that turn
// a list of messages into the prompt text the model was trained on.
//
// The engine implements the Jinja subset those templates use, with the
// semantics of Python's jinja2 as transformers configures it:
// ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, the
// loopcontrols extension, transformers' own `tojson` (json.dumps with
// ensure_ascii off) and its globals `raise_exception` and `strftime_now`.
// Values behave as Python's do: strings index by code point, `/` is true
// division, negative indexes count from the end, dicts keep insertion order,
// printing uses Python's str() and repr().
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else, loop.*,
// break/continue), set (also `set ns.attr`, block set), macro (with defaults
// and keyword arguments), call-free filter-free raw, generation (rendered as
// its body). Expressions: literals, lists, dicts, tuples, arithmetic,
// comparisons, in, and/or/not, `x if c else y`, `~`, attributes, subscripts,
// slices, calls, filters and tests (the sets listed in jinja/filters.cc).
// Anything else is INVALID_ARGUMENT when the template is parsed, naming it.
//
// A ChatTemplate is immutable once parsed and safe for concurrent Render calls.
#ifndef CHUNKATTN_TEXT_CHAT_TEMPLATE_H_
#define CHUNKATTN_TEXT_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace chunkattn {

namespace jinja {
struct Program;
}  // namespace jinja

class ChatTemplate {
 public:
  // Bounds that keep a hostile template from hanging or exhausting memory.
  struct Limits {
    size_t max_output_bytes = 64 << 20;
    long max_steps = 50'000'000;  // loop iterations, calls and output writes
    int max_depth = 200;          // nested calls and expressions
  };

  // Parses a template. INVALID_ARGUMENT naming the line and what is wrong
  // (a syntax error, an unknown tag, filter or test).
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with `context`'s keys as the template's variables (messages,
  // tools, add_generation_prompt, bos_token, ...). JSON objects keep their
  // key order, as Python dicts do. INVALID_ARGUMENT when the template fails:
  // for raise_exception(msg), the message is exactly msg and
  // IsRaisedByTemplate() is true; otherwise it says what failed (an
  // undefined value used, a type error, a limit reached).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const Limits& limits) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const {
    return Render(context, Limits());
  }

  // Whether `status` came from the template's own raise_exception().
  static bool IsRaisedByTemplate(const absl::Status& status);

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const jinja::Program> program_;
};

// A model's chat template and the variables transformers passes beside the
// messages: its special_tokens_map, from tokenizer_config.json (bos_token,
// eos_token, unk_token, sep_token, pad_token, cls_token, mask_token when set,
// each a string there or {"content": ...}; additional_special_tokens; the
// entries of extra_special_tokens).
struct ModelChatTemplate {
  ChatTemplate chat_template;
  // A config's named "tool_use" template, used when tools are given.
  std::optional<ChatTemplate> tool_use_template;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  // The template's text (then the tool_use one's): what tells which tool-call
  // and reasoning formats the model was trained on.
  std::string source;

  // messages / tools (JSON arrays; tools may be null) and extra variables
  // (e.g. enable_thinking) rendered as transformers' apply_chat_template does.
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                                    const nlohmann::ordered_json& tools,
                                    bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra,
                                    const ChatTemplate::Limits& limits = {}) const;
};

// Reads `template_path` (a chat_template.jinja) when not empty, else the
// "chat_template" of `tokenizer_config_path` (a string, or a list of
// {name, template} from which "default" and "tool_use" are taken). NOT_FOUND when there is no
// template; INVALID_ARGUMENT, naming the file, when a file is unreadable or
// not JSON or the template does not parse.
absl::StatusOr<ModelChatTemplate> LoadChatTemplateFiles(const std::string& tokenizer_config_path,
                                                        const std::string& template_path);

// The template of a model folder, as transformers finds it: chat_template.jinja
// if present, else tokenizer_config.json's. NOT_FOUND when it has neither.
absl::StatusOr<ModelChatTemplate> LoadChatTemplate(const std::string& model_dir);

}  // namespace chunkattn

#endif  // CHUNKATTN_TEXT_CHAT_TEMPLATE_H_
