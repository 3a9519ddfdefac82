#include "services/fronts/openai/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "services/core/scheduler.h"
#include "text/utf8.h"

namespace chunkattn::openai {
namespace {

using json = nlohmann::json;

constexpr int kMaxPrompts = 256;      // prompts in one completions request
constexpr int kMaxChoices = 64;       // n, as our API's samples
constexpr int kMaxTopLogprobs = 20;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Readers of optional typed fields: absent or null leaves *out unset; a wrong
// type or a value out of range is INVALID_ARGUMENT naming the field.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  const json* Get(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status Int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    std::optional<int64_t> value;
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        value = static_cast<int64_t>(v->get<uint64_t>());
      }
    } else if (v->is_number_integer()) {
      value = v->get<int64_t>();
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) value = static_cast<int64_t>(d);
    } else {
      return InvalidParam(key, absl::StrCat("'", key, "' must be an integer"));
    }
    if (!value || *value < lo || *value > hi) {
      return InvalidParam(key, absl::StrFormat("'%s' must be an integer in [%d, %d]", key, lo, hi));
    }
    *out = value;
    return absl::OkStatus();
  }

  absl::Status Number(const char* key, double lo, double hi, std::optional<double>* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return InvalidParam(key, absl::StrCat("'", key, "' must be a number"));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      return InvalidParam(key, absl::StrFormat("'%s' must be a number in [%g, %g]", key, lo, hi));
    }
    *out = d;
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, std::optional<bool>* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return InvalidParam(key, absl::StrCat("'", key, "' must be a boolean"));
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* key, std::optional<std::string>* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return InvalidParam(key, absl::StrCat("'", key, "' must be a string"));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const json& object_;
};

// Sampling, stopping and vLLM's extras: the fields both endpoints share.
struct Common {
  std::optional<int64_t> n, seed_signed, top_k, min_tokens, priority;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<bool> stream, ignore_eos, include_usage, return_token_ids, complete_within_max_tokens;
  std::optional<std::string> cache_salt;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::optional<ClientRequest::Retention> retention;
};

// Our extension "retention": {"priority", "duration_ms", "token_end"}
// (TensorRT-LLM's TokenRangeRetentionConfig names). Types here, ranges in
// the input processor (CheckRetention); an unknown key is refused, so a
// misspelt one never passes for plain LRU.
absl::Status ParseRetention(const json& v, std::optional<ClientRequest::Retention>* out) {
  if (!v.is_object()) return InvalidParam("retention", "'retention' must be an object");
  ClientRequest::Retention r;
  const Fields f(v);
  for (const auto& [key, field] : {std::pair<const char*, std::optional<int64_t>*>{"priority", &r.priority},
                                   {"duration_ms", &r.duration_ms},
                                   {"token_end", &r.token_end}}) {
    if (!f.Int(key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), field).ok()) {
      const std::string name = absl::StrCat("retention.", key);
      return InvalidParam(name, absl::StrCat("'", name, "' must be an integer"));
    }
  }
  for (const auto& [key, value] : v.items()) {
    if (key != "priority" && key != "duration_ms" && key != "token_end") {
      return InvalidParam("retention", absl::StrCat("'retention' has no field '", key,
                                                    "': give priority, duration_ms and token_end"));
    }
  }
  *out = r;
  return absl::OkStatus();
}

absl::Status Unsupported(const char* key, absl::string_view why) {
  return InvalidParam(key, absl::StrCat("'", key, "' ", why));
}

// Two parameters that each constrain the output: one is allowed.
absl::Status BothConstrain(const std::string& key, const std::string& other) {
  return InvalidParam(key, absl::StrCat("'", key, "' and '", other, "' both constrain the output: give one"));
}

// A JSON Schema given as an object (or a boolean), or as its text.
absl::StatusOr<std::string> SchemaText(const json& schema, absl::string_view param) {
  if (schema.is_object() || schema.is_boolean()) return Dump(schema);
  if (schema.is_string()) return schema.get<std::string>();
  return InvalidParam(param, absl::StrCat("'", param, "' must be a JSON Schema (an object)"));
}

// Structured outputs: OpenAI's response_format, vLLM's structured_outputs
// and its older guided_* fields; at most one of them constrains the output
// (ApiRequest::constraint_param names it). Whatever the engine cannot honour
// is refused, never ignored.
absl::Status ParseConstraint(const Fields& f, std::optional<grammar::Constraint>* out, std::string* param) {
  using grammar::ConstraintKind;
  auto set = [&](const std::string& key, grammar::Constraint c) -> absl::Status {
    if (out->has_value()) {
      return BothConstrain(key, *param);
    }
    *out = std::move(c);
    *param = key;
    return absl::OkStatus();
  };
  if (const json* format = f.Get("response_format"); format != nullptr) {
    if (!format->is_object()) return InvalidParam("response_format", "'response_format' must be an object");
    const json type = format->value("type", json());
    if (type == "json_object") {
      RETURN_IF_ERROR(set("response_format", {ConstraintKind::kJsonObject, ""}));
    } else if (type == "json_schema") {
      const json* spec = Fields(*format).Get("json_schema");
      const json* schema = spec != nullptr && spec->is_object() ? Fields(*spec).Get("schema") : nullptr;
      if (schema == nullptr) {
        return InvalidParam("response_format", "'response_format.json_schema.schema' is required");
      }
      // strict or not, the schema is enforced (as vLLM does).
      ASSIGN_OR_RETURN(std::string text, SchemaText(*schema, "response_format.json_schema.schema"));
      RETURN_IF_ERROR(set("response_format", {ConstraintKind::kJsonSchema, std::move(text)}));
    } else if (type != "text") {
      return InvalidParam("response_format",
                          "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  // vLLM's fields: each names one kind.
  auto vllm = [&](const std::string& key, const json& v, const std::string& kind) -> absl::Status {
    if (kind == "json") {
      ASSIGN_OR_RETURN(std::string text, SchemaText(v, key));
      return set(key, {ConstraintKind::kJsonSchema, std::move(text)});
    }
    if (kind == "regex" || kind == "grammar") {
      if (!v.is_string()) return InvalidParam(key, absl::StrCat("'", key, "' must be a string"));
      return set(key, {kind == "regex" ? ConstraintKind::kRegex : ConstraintKind::kGrammar, v.get<std::string>()});
    }
    if (kind == "choice") {
      std::vector<std::string> choices;
      if (v.is_array()) {
        for (const json& c : v) {
          if (!c.is_string()) break;
          choices.push_back(c.get<std::string>());
        }
      }
      if (choices.empty() || choices.size() != v.size()) {
        return InvalidParam(key, absl::StrCat("'", key, "' must be a non-empty array of strings"));
      }
      return set(key, grammar::ChoiceConstraint(choices));
    }
    if (kind == "json_object") {
      if (!v.is_boolean()) return InvalidParam(key, absl::StrCat("'", key, "' must be a boolean"));
      return v.get<bool>() ? set(key, {ConstraintKind::kJsonObject, ""}) : absl::OkStatus();
    }
    return Unsupported(key.c_str(), "is not supported (json, regex, choice, grammar and json_object are)");
  };
  if (const json* so = f.Get("structured_outputs"); so != nullptr) {
    if (!so->is_object()) return InvalidParam("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      // Options that only tune a backend's search are accepted and moot here.
      if (key == "disable_fallback" || key == "disable_any_whitespace" || key == "disable_additional_properties") {
        continue;
      }
      RETURN_IF_ERROR(vllm(absl::StrCat("structured_outputs.", key), value, key));
    }
  }
  for (const char* kind : {"json", "regex", "choice", "grammar"}) {
    const std::string key = absl::StrCat("guided_", kind);
    if (const json* v = f.Get(key.c_str()); v != nullptr) RETURN_IF_ERROR(vllm(key, *v, kind));
  }
  for (const char* key : {"guided_decoding_backend", "guided_whitespace_pattern", "structural_tag"}) {
    if (f.Get(key) != nullptr) return Unsupported(key, "is not supported");
  }
  return absl::OkStatus();
}

// A function's parameters as a JSON Schema (none: an object of anything).
std::string ParametersSchema(const json& function) {
  auto it = function.find("parameters");
  return it == function.end() || it->is_null() ? std::string(R"({"type":"object"})") : Dump(*it);
}

// tools and tool_choice (chat): how the reply's calls are made. "required"
// and a named function constrain the output (a JSON array of calls, or the
// named function's arguments); "auto" leaves it free and the reply's text
// is parsed for calls in the model's format.
absl::Status ParseTools(const Fields& f, ChatPrompt* chat, ApiRequest* out,
                        std::optional<grammar::Constraint>* constraint, std::string* param) {
  std::vector<std::pair<std::string, std::string>> functions;  // name, parameters schema
  if (const json* tools = f.Get("tools"); tools != nullptr) {
    if (!tools->is_array()) return InvalidParam("tools", "'tools' must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string at = absl::StrFormat("tools[%d]", i);
      if (!tool.is_object() || tool.value("type", json("function")) != "function" || !tool.contains("function") ||
          !tool["function"].is_object() || !tool["function"].value("name", json()).is_string() ||
          tool["function"]["name"].get<std::string>().empty()) {
        return InvalidParam(at, absl::StrCat("'", at, "' must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
      }
      functions.emplace_back(tool["function"]["name"].get<std::string>(), ParametersSchema(tool["function"]));
    }
    if (!tools->empty()) chat->tools_json = Dump(*tools);
  }
  out->tool_mode = functions.empty() ? ToolMode::kNone : ToolMode::kAuto;
  const json* choice = f.Get("tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string() && (*choice == "none" || *choice == "auto" || *choice == "required")) {
    const std::string mode = choice->get<std::string>();
    if (mode == "none") {
      out->tool_mode = ToolMode::kNone;
      return absl::OkStatus();
    }
    if (functions.empty()) return InvalidParam("tool_choice", absl::StrCat("'tool_choice' \"", mode, "\" needs 'tools'"));
    if (mode == "auto") return absl::OkStatus();
    // One or more calls, each {"name": one of the tools, "parameters": its arguments}.
    std::string items;
    for (const auto& [name, schema] : functions) {
      absl::StrAppend(&items, items.empty() ? "" : ",", R"({"type":"object","properties":{"name":{"const":)",
                      Dump(json(name)), R"(},"parameters":)", schema,
                      R"(},"required":["name","parameters"],"additionalProperties":false})");
    }
    if (!param->empty()) {
      return BothConstrain("tool_choice", *param);
    }
    out->tool_mode = ToolMode::kRequired;
    *constraint = grammar::Constraint{grammar::ConstraintKind::kJsonSchema,
                                      absl::StrCat(R"({"type":"array","minItems":1,"items":{"anyOf":[)", items, "]}}")};
    *param = "tool_choice";
    return absl::OkStatus();
  }
  const json* function = choice->is_object() ? Fields(*choice).Get("function") : nullptr;
  const json* name = function != nullptr && function->is_object() ? Fields(*function).Get("name") : nullptr;
  if (name == nullptr || !name->is_string() || choice->value("type", json("function")) != "function") {
    return InvalidParam("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  auto it = std::find_if(functions.begin(), functions.end(), [&](const auto& fn) { return fn.first == *name; });
  if (it == functions.end()) {
    return InvalidParam("tool_choice", absl::StrCat("'tool_choice' names '", name->get<std::string>(),
                                                    "', which is not one of 'tools'"));
  }
  if (!param->empty()) {
    return BothConstrain("tool_choice", *param);
  }
  out->tool_mode = ToolMode::kNamed;
  out->tool_name = it->first;
  *constraint = grammar::Constraint{grammar::ConstraintKind::kJsonSchema, it->second};
  *param = "tool_choice";
  return absl::OkStatus();
}

absl::Status ParseCommon(const json& body, Common* c) {
  Fields f(body);
  RETURN_IF_ERROR(f.Int("n", 1, kMaxChoices, &c->n));
  // OpenAI documents seed as an integer; negative ones wrap to 64 bits.
  if (const json* seed = f.Get("seed"); seed != nullptr && seed->is_number_unsigned()) {
    c->seed_signed = static_cast<int64_t>(seed->get<uint64_t>());
  } else {
    RETURN_IF_ERROR(f.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                          &c->seed_signed));
  }
  RETURN_IF_ERROR(f.Number("temperature", 0, 1e6, &c->temperature));
  RETURN_IF_ERROR(f.Number("top_p", 0, 1, &c->top_p));
  if (c->top_p && *c->top_p <= 0) return InvalidParam("top_p", "'top_p' must be in (0, 1]");
  RETURN_IF_ERROR(f.Int("top_k", -1, std::numeric_limits<int32_t>::max(), &c->top_k));
  RETURN_IF_ERROR(f.Number("min_p", 0, 1, &c->min_p));
  RETURN_IF_ERROR(f.Number("repetition_penalty", 0, 1e6, &c->repetition_penalty));
  if (c->repetition_penalty && *c->repetition_penalty <= 0) {
    return InvalidParam("repetition_penalty", "'repetition_penalty' must be > 0");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> penalty;
    RETURN_IF_ERROR(f.Number(key, -2, 2, &penalty));
    if (penalty && *penalty != 0) return Unsupported(key, "is not supported (use repetition_penalty)");
  }
  if (const json* bias = f.Get("logit_bias"); bias != nullptr && !(bias->is_object() && bias->empty())) {
    return Unsupported("logit_bias", "is not supported");
  }
  RETURN_IF_ERROR(f.Bool("stream", &c->stream));
  if (const json* options = f.Get("stream_options"); options != nullptr) {
    if (!options->is_object()) return InvalidParam("stream_options", "'stream_options' must be an object");
    if (!c->stream.value_or(false)) {
      return InvalidParam("stream_options", "'stream_options' is only allowed with stream: true");
    }
    RETURN_IF_ERROR(Fields(*options).Bool("include_usage", &c->include_usage));
  }
  RETURN_IF_ERROR(f.Bool("ignore_eos", &c->ignore_eos));
  RETURN_IF_ERROR(f.Bool("return_token_ids", &c->return_token_ids));
  RETURN_IF_ERROR(f.Bool("complete_within_max_tokens", &c->complete_within_max_tokens));
  RETURN_IF_ERROR(f.Int("min_tokens", 0, std::numeric_limits<int32_t>::max(), &c->min_tokens));
  RETURN_IF_ERROR(f.Int("priority", -1000000, 1000000, &c->priority));
  if (const json* stop = f.Get("stop"); stop != nullptr) {
    if (stop->is_string()) {
      c->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return InvalidParam("stop", "'stop' must be a string or an array of strings");
        c->stop.push_back(s.get<std::string>());
      }
    } else {
      return InvalidParam("stop", "'stop' must be a string or an array of strings");
    }
  }
  if (const json* ids = f.Get("stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return InvalidParam("stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("stop_token_ids", "'stop_token_ids' must be an array of token ids");
      }
      c->stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  std::optional<std::string> salt, ns;
  RETURN_IF_ERROR(f.String("cache_salt", &salt));
  RETURN_IF_ERROR(f.String("cache_namespace", &ns));
  if (salt && ns) return InvalidParam("cache_salt", "give 'cache_salt' or 'cache_namespace', not both");
  if (salt && salt->empty()) return InvalidParam("cache_salt", "'cache_salt' must not be empty");
  c->cache_salt = salt ? salt : ns;
  std::optional<std::string> user;
  RETURN_IF_ERROR(f.String("user", &user));  // accepted and not used
  if (const json* retention = f.Get("retention"); retention != nullptr) {
    RETURN_IF_ERROR(ParseRetention(*retention, &c->retention));
  }
  return absl::OkStatus();
}

// Fills what every prompt of the request shares.
absl::Status Apply(const Common& c, std::optional<int64_t> max_tokens, ApiRequest* out) {
  out->n = static_cast<uint32_t>(c.n.value_or(1));
  out->stream = c.stream.value_or(false);
  out->include_usage = c.include_usage.value_or(false);
  out->return_token_ids = c.return_token_ids.value_or(false);
  if (c.min_tokens && max_tokens && *c.min_tokens > *max_tokens) {
    return InvalidParam("min_tokens", "'min_tokens' must not exceed max_tokens");
  }
  ClientRequest request;
  ClientRequest::Sampling& s = request.sampling;
  if (c.temperature) s.temperature = static_cast<float>(*c.temperature);
  if (c.top_p) s.top_p = static_cast<float>(*c.top_p);
  if (c.top_k) s.top_k = static_cast<int32_t>(std::max<int64_t>(*c.top_k, 0));  // vLLM's -1 is off
  if (c.min_p) s.min_p = static_cast<float>(*c.min_p);
  if (c.repetition_penalty) s.repetition_penalty = static_cast<float>(*c.repetition_penalty);
  if (c.seed_signed) s.seed = static_cast<uint64_t>(*c.seed_signed);
  ClientRequest::Stopping& stop = request.stopping;
  stop.max_new_tokens = max_tokens;
  // Chat without max_tokens: up to the end of the context, as vLLM.
  stop.fill_context = !max_tokens.has_value();
  stop.stop = c.stop;
  stop.stop_token_ids = c.stop_token_ids;
  stop.ignore_eos = c.ignore_eos.value_or(false);
  stop.min_tokens = c.min_tokens.value_or(0);
  if (c.cache_salt) request.cache_namespace = *c.cache_salt;
  request.n = out->n;
  request.priority = static_cast<int32_t>(c.priority.value_or(0));
  request.return_logprobs = out->logprobs;
  request.top_logprobs = out->top_logprobs;
  request.complete_within_max_tokens = c.complete_within_max_tokens.value_or(false);
  request.retention = c.retention;
  out->prompts.push_back(std::move(request));
  return absl::OkStatus();
}

int64_t CodePoints(absl::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  std::string type = "server_error";
  json code = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      type = "invalid_request_error";
      code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      // A request that can never fit the KV pool is the client's to change;
      // a full queue is worth a retry.
      if (status.GetPayload(kNeverFitsPayload).has_value()) {
        e.http_status = 400;
        type = "invalid_request_error";
      } else {
        e.http_status = 429;
        type = "rate_limit_error";
        code = "rate_limit_exceeded";
      }
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      type = "service_unavailable_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      type = "timeout_error";
      break;
    default:
      e.http_status = 500;
      break;
  }
  json param = nullptr;
  if (auto p = status.GetPayload(kParamPayload); p.has_value()) param = std::string(*p);
  e.body = Dump({{"error", {{"message", std::string(status.message())}, {"type", type}, {"param", param},
                            {"code", code}}}});
  return e;
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  // nlohmann's parser is iterative, but a bound keeps every later walk over
  // the value (and its destruction) cheap and shallow.
  int depth = 0;
  bool in_string = false, escape = false;
  for (char c : body) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(absl::StrFormat("the body nests deeper than %d levels", kMaxJsonDepth));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON (UTF-8)");
  if (!parsed.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  return parsed;
}

absl::Status CheckModel(const json& body, const ServedModel& model) {
  std::optional<std::string> name;
  RETURN_IF_ERROR(Fields(body).String("model", &name));
  if (name && *name != model.name) {
    absl::Status status = absl::NotFoundError(absl::StrCat("The model `", *name, "` does not exist."));
    status.SetPayload(kParamPayload, absl::Cord("model"));
    return status;
  }
  return absl::OkStatus();
}

absl::Status NameOpenAiFields(const absl::Status& status, Endpoint endpoint, absl::string_view prompt,
                              absl::string_view constraint_param) {
  const std::optional<FieldRef> at = ErrorField(status);
  if (!at.has_value()) return status;
  const bool chat = endpoint == Endpoint::kChat;
  // The parameter (error.param), and the element the message names.
  std::string param;
  int index = -1;
  switch (at->field) {
    case RequestField::kRequestId:
      param = "X-Request-Id";
      break;
    case RequestField::kCacheNamespace:
      param = "cache_salt";
      break;
    case RequestField::kPrompt:
    case RequestField::kPromptText:
    case RequestField::kPromptTokenIds:
      param = chat ? "messages" : "prompt";
      index = at->index;
      break;
    case RequestField::kChat:
    case RequestField::kChatMessages:
      param = "messages";
      break;
    case RequestField::kChatMessageRole:
      param = absl::StrCat(WithIndex("messages", at->index), ".role");
      break;
    case RequestField::kChatToolCalls:
      param = absl::StrCat(WithIndex("messages", at->index), ".tool_calls");
      break;
    case RequestField::kChatTools:
      param = "tools";
      break;
    case RequestField::kChatTemplateKwargs:
      param = "chat_template_kwargs";
      break;
    case RequestField::kTemperature:
      param = "temperature";
      break;
    case RequestField::kTopK:
      param = "top_k";
      break;
    case RequestField::kTopP:
      param = "top_p";
      break;
    case RequestField::kMinP:
      param = "min_p";
      break;
    case RequestField::kRepetitionPenalty:
      param = "repetition_penalty";
      break;
    case RequestField::kMaxNewTokens:
      param = "max_tokens";
      break;
    case RequestField::kStopTokenIds:
      param = "stop_token_ids";
      index = at->index;
      break;
    case RequestField::kStop:
      param = "stop";
      index = at->index;
      break;
    case RequestField::kMinTokens:
      param = "min_tokens";
      break;
    case RequestField::kN:
      param = "n";
      break;
    case RequestField::kPriority:
      param = "priority";
      break;
    case RequestField::kTopLogprobs:
      param = chat ? "top_logprobs" : "logprobs";  // completions' logprobs is the count
      break;
    case RequestField::kConstraint:
      param = std::string(constraint_param.empty() ? "complete_within_max_tokens" : constraint_param);
      break;
    case RequestField::kRetentionPriority:
      param = "retention.priority";
      break;
    case RequestField::kRetentionDurationMs:
      param = "retention.duration_ms";
      break;
    case RequestField::kRetentionTokenEnd:
      param = "retention.token_end";
      break;
  }
  const std::string name = param == "prompt" ? WithIndex(prompt, index) : WithIndex(param, index);
  absl::Status named = NameErrorField(status, [&name](FieldRef) { return absl::StrCat("'", name, "'"); });
  named.SetPayload(kParamPayload, absl::Cord(param));
  return named;
}

absl::StatusOr<ApiRequest> ParseCompletionRequest(const json& body, const ServedModel& model) {
  RETURN_IF_ERROR(CheckModel(body, model));
  Fields f(body);
  ApiRequest out;
  out.endpoint = Endpoint::kCompletions;
  Common common;
  RETURN_IF_ERROR(ParseCommon(body, &common));
  std::optional<int64_t> max_tokens, logprobs, best_of;
  RETURN_IF_ERROR(f.Int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens));
  if (!max_tokens) max_tokens = 16;  // OpenAI's default for completions
  RETURN_IF_ERROR(f.Int("logprobs", 0, kMaxTopLogprobs, &logprobs));
  RETURN_IF_ERROR(f.Int("best_of", 1, kMaxChoices, &best_of));
  if (best_of && *best_of != common.n.value_or(1)) {
    return Unsupported("best_of", "must equal n (choosing the best of several samples is not supported)");
  }
  std::optional<bool> echo, add_special;
  RETURN_IF_ERROR(f.Bool("echo", &echo));
  RETURN_IF_ERROR(f.Bool("add_special_tokens", &add_special));
  if (add_special && !*add_special) {
    return Unsupported("add_special_tokens", "false is not supported; send token ids for exact control");
  }
  if (const json* suffix = f.Get("suffix"); suffix != nullptr && !(suffix->is_string() && suffix->empty())) {
    return Unsupported("suffix", "is not supported");
  }
  out.echo = echo.value_or(false);
  out.logprobs = logprobs.has_value();
  out.top_logprobs = static_cast<uint32_t>(logprobs.value_or(0));
  if (out.echo && out.logprobs) return Unsupported("echo", "with logprobs is not supported (prompt logprobs)");
  std::optional<grammar::Constraint> constraint;
  RETURN_IF_ERROR(ParseConstraint(f, &constraint, &out.constraint_param));

  const json* prompt = f.Get("prompt");
  if (prompt == nullptr) return InvalidParam("prompt", "'prompt' is required");
  const char* kShape = "'prompt' must be a string, an array of strings, an array of token ids, or an array of "
                       "arrays of token ids";
  std::vector<Prompt> prompts;
  auto token_ids = [&](const json& ids) -> absl::Status {
    if (ids.empty()) return InvalidParam("prompt", "a token-id prompt must not be empty");
    TokenPrompt tokens;
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("prompt", kShape);
      }
      tokens.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    prompts.push_back(std::move(tokens));
    return absl::OkStatus();
  };
  if (prompt->is_string()) {
    prompts.push_back(TextPrompt{prompt->get<std::string>()});
  } else if (prompt->is_array() && !prompt->empty()) {
    const json& first = prompt->front();
    if (first.is_number()) {
      RETURN_IF_ERROR(token_ids(*prompt));
    } else {
      if (prompt->size() > static_cast<size_t>(kMaxPrompts)) {
        return InvalidParam("prompt", absl::StrFormat("at most %d prompts in one request", kMaxPrompts));
      }
      for (const json& p : *prompt) {
        if (p.is_string() && first.is_string()) {
          prompts.push_back(TextPrompt{p.get<std::string>()});
        } else if (p.is_array() && first.is_array()) {
          RETURN_IF_ERROR(token_ids(p));
        } else {
          return InvalidParam("prompt", kShape);
        }
      }
    }
  } else {
    return InvalidParam("prompt", kShape);
  }
  // One small body must not take the whole engine: prompts x n sequences.
  const int64_t sequences = static_cast<int64_t>(prompts.size()) * common.n.value_or(1);
  if (sequences > model.max_sequences) {
    return InvalidParam("n", absl::StrFormat("%d prompts x n = %d sequences; at most %d in one request",
                                             prompts.size(), sequences, model.max_sequences));
  }
  RETURN_IF_ERROR(Apply(common, max_tokens, &out));
  const ClientRequest shared = std::move(out.prompts.back());
  out.prompts.clear();
  for (Prompt& p : prompts) {
    ClientRequest& r = out.prompts.emplace_back(shared);
    r.prompt = std::move(p);
    r.constraint = constraint;
  }
  return out;
}

absl::StatusOr<ApiRequest> ParseChatRequest(const json& body, const ServedModel& model) {
  RETURN_IF_ERROR(CheckModel(body, model));
  Fields f(body);
  ApiRequest out;
  out.endpoint = Endpoint::kChat;
  Common common;
  RETURN_IF_ERROR(ParseCommon(body, &common));
  std::optional<int64_t> max_tokens, legacy_max, top_logprobs;
  RETURN_IF_ERROR(f.Int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens));
  RETURN_IF_ERROR(f.Int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &legacy_max));
  if (!max_tokens) max_tokens = legacy_max;
  std::optional<bool> logprobs, add_generation_prompt, continue_final, echo, add_special;
  RETURN_IF_ERROR(f.Bool("logprobs", &logprobs));
  RETURN_IF_ERROR(f.Int("top_logprobs", 0, kMaxTopLogprobs, &top_logprobs));
  if (top_logprobs && !logprobs.value_or(false)) {
    return InvalidParam("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  out.logprobs = logprobs.value_or(false);
  out.top_logprobs = static_cast<uint32_t>(top_logprobs.value_or(0));
  RETURN_IF_ERROR(f.Bool("add_generation_prompt", &add_generation_prompt));
  RETURN_IF_ERROR(f.Bool("continue_final_message", &continue_final));
  RETURN_IF_ERROR(f.Bool("echo", &echo));
  RETURN_IF_ERROR(f.Bool("add_special_tokens", &add_special));
  if (continue_final.value_or(false)) return Unsupported("continue_final_message", "is not supported");
  if (echo.value_or(false)) return Unsupported("echo", "is not supported on chat completions");
  if (add_special.value_or(false)) return Unsupported("add_special_tokens", "true is not supported on chat");
  if (f.Get("chat_template") != nullptr) {
    return Unsupported("chat_template", "is not supported: the model's own template is used");
  }
  std::optional<grammar::Constraint> constraint;
  RETURN_IF_ERROR(ParseConstraint(f, &constraint, &out.constraint_param));

  ChatPrompt chat;
  RETURN_IF_ERROR(ParseTools(f, &chat, &out, &constraint, &out.constraint_param));
  const json* messages = f.Get("messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return InvalidParam("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = absl::StrFormat("messages[%d]", i);
    if (!m.is_object()) return InvalidParam(at, absl::StrCat("'", at, "' must be an object"));
    Fields mf(m);
    ChatMessage& message = chat.messages.emplace_back();
    std::optional<std::string> role, name, tool_call_id, reasoning, reasoning_alt;
    RETURN_IF_ERROR(mf.String("role", &role));
    if (!role || role->empty()) return InvalidParam(at + ".role", absl::StrCat("'", at, ".role' is required"));
    message.role = *role;
    if (const json* content = mf.Get("content"); content != nullptr) {
      if (content->is_string()) {
        message.content = content->get<std::string>();
      } else if (content->is_array()) {
        // Text parts joined by newlines, as vLLM renders them for templates
        // that take a string.
        std::string text;
        for (const json& part : *content) {
          if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return Unsupported("messages", "content parts other than {\"type\": \"text\", \"text\": ...} are not "
                                           "supported");
          }
          if (!text.empty()) text += "\n";
          text += part["text"].get<std::string>();
        }
        message.content = std::move(text);
      } else {
        return InvalidParam(at + ".content", absl::StrCat("'", at, ".content' must be a string or an array"));
      }
    }
    RETURN_IF_ERROR(mf.String("name", &name));
    RETURN_IF_ERROR(mf.String("tool_call_id", &tool_call_id));
    RETURN_IF_ERROR(mf.String("reasoning_content", &reasoning));
    RETURN_IF_ERROR(mf.String("reasoning", &reasoning_alt));
    if (name) message.name = *name;
    if (tool_call_id) message.tool_call_id = *tool_call_id;
    if (reasoning || reasoning_alt) message.reasoning_content = reasoning ? *reasoning : *reasoning_alt;
    if (const json* calls = mf.Get("tool_calls"); calls != nullptr) {
      if (!calls->is_array()) return InvalidParam(at + ".tool_calls", "'tool_calls' must be an array");
      message.tool_calls_json = Dump(*calls);
    }
  }
  if (const json* kwargs = f.Get("chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return InvalidParam("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    chat.template_kwargs_json = Dump(*kwargs);
  }
  if (add_generation_prompt) chat.add_generation_prompt = *add_generation_prompt;
  RETURN_IF_ERROR(Apply(common, max_tokens, &out));
  out.prompts.back().prompt = std::move(chat);
  out.prompts.back().constraint = std::move(constraint);
  out.output = model.output;
  return out;
}

ResponseBuilder::ResponseBuilder(const ApiRequest& request, std::string id, std::string model, int64_t created,
                                 std::vector<PromptEcho> prompts, const Tokenizer* tokenizer)
    : request_(request),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      prompts_(std::move(prompts)),
      tokenizer_(tokenizer),
      choices_(request.prompts.size() * request.n),
      prompt_tokens_(request.prompts.size(), 0),
      cached_tokens_(request.prompts.size(), 0) {
  if (request_.echo) {
    for (size_t c = 0; c < choices_.size(); ++c) choices_[c].text = prompts_[c / request_.n].text;
  }
  if (request_.endpoint == Endpoint::kChat && request_.stream) {
    for (Choice& choice : choices_) {
      if (request_.output.reasoning) choice.reasoning.emplace(request_.output.starts_in_reasoning);
      if (request_.tool_mode == ToolMode::kAuto) choice.tool_parser.emplace(request_.output.tool_calls, &ids_);
    }
  }
}

namespace {

// tool_choice "required": the constrained reply, a JSON array of
// {"name", "parameters"}, as (name, compact arguments); nullopt when the
// text is not one (cut short by max_tokens).
std::optional<std::vector<std::pair<std::string, std::string>>> RequiredCalls(const std::string& text) {
  json array = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!array.is_array() || array.empty()) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> calls;
  for (const json& call : array) {
    if (!call.is_object() || !call.value("name", json()).is_string() || !call.contains("parameters")) {
      return std::nullopt;
    }
    calls.emplace_back(call["name"].get<std::string>(), Dump(call["parameters"]));
  }
  return calls;
}

}  // namespace

json ResponseBuilder::ToolCallJson(int index, const std::string& id, const std::string& name,
                                   const std::string& arguments) {
  json call = {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
  if (index >= 0) call["index"] = index;
  return call;
}

json ResponseBuilder::ChatDelta(Choice& choice, const std::string& text, bool last) {
  std::string content = text, reasoning;
  if (choice.reasoning) {
    tools::ReasoningParser::Delta d = choice.reasoning->Feed(text);
    if (last) {
      tools::ReasoningParser::Delta rest = choice.reasoning->Finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
    }
    reasoning = std::move(d.reasoning);
    content = std::move(d.content);
  }
  json calls = json::array();
  switch (request_.tool_mode) {
    case ToolMode::kNone:
      break;
    case ToolMode::kAuto: {
      std::vector<tools::ToolDelta> deltas = choice.tool_parser->Feed(content);
      if (last) {
        std::vector<tools::ToolDelta> rest = choice.tool_parser->Finish();
        deltas.insert(deltas.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
      }
      content.clear();
      for (tools::ToolDelta& d : deltas) {
        if (!d.is_tool_call()) {
          content += d.content;
        } else if (!d.id.empty()) {
          calls.push_back(ToolCallJson(d.index, d.id, d.name, d.arguments));
        } else {
          calls.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
        }
      }
      break;
    }
    case ToolMode::kNamed:
      // The reply is the function's arguments: streamed as they come.
      if (!choice.named_started) {
        calls.push_back(ToolCallJson(0, ids_.Next(), request_.tool_name, content));
        choice.named_started = true;
      } else if (!content.empty()) {
        calls.push_back({{"index", 0}, {"function", {{"arguments", content}}}});
      }
      content.clear();
      break;
    case ToolMode::kRequired:
      // A JSON array of calls: whole once it has ended.
      choice.text += content;
      content.clear();
      if (last) {
        if (auto parsed = RequiredCalls(choice.text); parsed.has_value()) {
          for (size_t i = 0; i < parsed->size(); ++i) {
            calls.push_back(ToolCallJson(static_cast<int>(i), ids_.Next(), (*parsed)[i].first, (*parsed)[i].second));
          }
        } else {
          content = choice.text;  // cut short: the text as it is
        }
      }
      break;
  }
  if (!calls.empty()) choice.calls_streamed = true;
  json delta = json::object();
  if (!reasoning.empty()) delta["reasoning_content"] = std::move(reasoning);
  if (!content.empty()) delta["content"] = std::move(content);
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  return delta;
}

json ResponseBuilder::ChatMessage(const Choice& choice, std::string* finish_reason) const {
  std::string content = choice.text;
  json message = {{"role", "assistant"}};
  if (request_.output.reasoning) {
    tools::ReasoningParser::Delta d = tools::ReasoningParser::Split(content, request_.output.starts_in_reasoning);
    message["reasoning_content"] = d.reasoning.empty() ? json() : json(d.reasoning);
    content = std::move(d.content);
  }
  json calls = json::array();
  switch (request_.tool_mode) {
    case ToolMode::kNone:
      break;
    case ToolMode::kAuto: {
      tools::ParsedOutput parsed = tools::ParseToolCalls(request_.output.tool_calls, content, &ids_);
      for (const tools::ToolCall& c : parsed.calls) {
        calls.push_back(ToolCallJson(-1, c.id, c.name, c.arguments));
      }
      if (!parsed.calls.empty()) content = std::move(parsed.content);
      break;
    }
    case ToolMode::kNamed: {
      // Compact when it parses (it does, unless cut short by max_tokens).
      json args = json::parse(content, nullptr, /*allow_exceptions=*/false);
      calls.push_back(ToolCallJson(-1, ids_.Next(), request_.tool_name, args.is_discarded() ? content : Dump(args)));
      content.clear();
      break;
    }
    case ToolMode::kRequired:
      if (auto parsed = RequiredCalls(content); parsed.has_value()) {
        for (size_t i = 0; i < parsed->size(); ++i) {
          calls.push_back(ToolCallJson(-1, ids_.Next(), (*parsed)[i].first, (*parsed)[i].second));
        }
        content.clear();
      }
      break;
  }
  message["content"] = content.empty() && !calls.empty() ? json() : json(content);
  if (!calls.empty()) {
    message["tool_calls"] = std::move(calls);
    // OpenAI ends a named function's call with "stop", any other with "tool_calls".
    if (*finish_reason == "stop" && request_.tool_mode != ToolMode::kNamed) *finish_reason = "tool_calls";
  }
  return message;
}

std::string ResponseBuilder::Event(json choices, bool with_usage_null, json extra) const {
  const bool chat = request_.endpoint == Endpoint::kChat;
  json event = {{"id", id_},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", model_},
                {"choices", std::move(choices)}};
  if (extra.is_object()) event.update(extra);
  if (with_usage_null) event["usage"] = nullptr;
  return absl::StrCat("data: ", Dump(event), "\n\n");
}

std::string ResponseBuilder::StreamStart() {
  std::string out;
  for (size_t c = 0; c < choices_.size(); ++c) {
    json choice = {{"index", c}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    json extra = nullptr;
    if (request_.endpoint == Endpoint::kChat) {
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
      // vLLM sends chat's prompt ids at the top of the first chunk.
      if (request_.return_token_ids) extra = {{"prompt_token_ids", prompts_[c / request_.n].token_ids}};
    } else if (request_.echo) {
      choice["text"] = choices_[c].text;
      choices_[c].text_offset = CodePoints(choices_[c].text);
      if (request_.return_token_ids) {
        choice["prompt_token_ids"] = prompts_[c / request_.n].token_ids;
        choice["token_ids"] = json::array();
        choices_[c].prompt_ids_sent = true;
      }
    } else {
      continue;
    }
    out += Event(json::array({std::move(choice)}), request_.include_usage, std::move(extra));
  }
  return out;
}

json ResponseBuilder::Logprobs(const GenerationOutput& r, Choice& choice) const {
  auto token_text = [&](int32_t id, json* bytes) {
    absl::StatusOr<std::string> b =
        tokenizer_ != nullptr ? tokenizer_->TokenBytes(id) : absl::StatusOr<std::string>(std::string());
    std::string raw = b.ok() ? *b : std::string();
    if (bytes != nullptr) {
      *bytes = json::array();
      for (unsigned char c : raw) bytes->push_back(static_cast<int>(c));
    }
    return ReplaceInvalidUtf8(raw);
  };
  if (request_.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (size_t i = 0; i < r.token_ids.size(); ++i) {
      json bytes;
      json entry = {{"token", token_text(r.token_ids[i], &bytes)},
                    {"logprob", i < r.logprobs.size() ? r.logprobs[i] : 0.0f}};
      entry["bytes"] = std::move(bytes);
      json top = json::array();
      if (i < r.top_logprobs.size()) {
        const GenerationOutput::TopLogprobs& t = r.top_logprobs[i];
        for (size_t k = 0; k < t.token_ids.size() && k < t.logprobs.size(); ++k) {
          json top_bytes;
          json e = {{"token", token_text(t.token_ids[k], &top_bytes)}, {"logprob", t.logprobs[k]}};
          e["bytes"] = std::move(top_bytes);
          top.push_back(std::move(e));
        }
      }
      entry["top_logprobs"] = std::move(top);
      content.push_back(std::move(entry));
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (size_t i = 0; i < r.token_ids.size(); ++i) {
    const std::string text = token_text(r.token_ids[i], nullptr);
    const float logprob = i < r.logprobs.size() ? r.logprobs[i] : 0.0f;
    tokens.push_back(text);
    token_logprobs.push_back(logprob);
    offsets.push_back(choice.text_offset);
    // The chosen token and the N most likely, keyed by their text (OpenAI's shape).
    json entries = json::object();
    entries[text] = logprob;
    if (i < r.top_logprobs.size()) {
      const GenerationOutput::TopLogprobs& t = r.top_logprobs[i];
      for (size_t k = 0; k < t.token_ids.size() && k < t.logprobs.size(); ++k) {
        entries[token_text(t.token_ids[k], nullptr)] = t.logprobs[k];
      }
    }
    top.push_back(std::move(entries));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

std::string ResponseBuilder::Add(int prompt, const GenerationOutput& r) {
  const size_t index = static_cast<size_t>(prompt) * request_.n + static_cast<size_t>(r.index);
  if (prompt < 0 || static_cast<size_t>(prompt) >= prompt_tokens_.size() || index >= choices_.size()) return "";
  Choice& choice = choices_[index];
  json logprobs = nullptr;
  if (request_.logprobs) logprobs = Logprobs(r, choice);
  choice.text_offset += CodePoints(r.text);
  json finish = nullptr;
  if (r.finish_reason != FinishReason::kNone) {
    choice.finish_reason = VllmFinishReason(r.finish_reason);
    finish = choice.finish_reason;
    ++finished_;
    const GenerationOutput::Usage usage = r.usage.value_or(GenerationOutput::Usage{});
    prompt_tokens_[prompt] = usage.prompt_tokens;
    cached_tokens_[prompt] = usage.cached_prompt_tokens;
    completion_tokens_ += usage.completion_tokens;
  }
  if (!request_.stream) {
    choice.text += r.text;
    if (request_.return_token_ids) choice.token_ids.insert(choice.token_ids.end(), r.token_ids.begin(), r.token_ids.end());
    if (request_.logprobs) {
      if (choice.logprobs.is_null()) {
        choice.logprobs = std::move(logprobs);
      } else {
        for (auto& [key, value] : logprobs.items()) {
          for (json& v : value) choice.logprobs[key].push_back(std::move(v));
        }
      }
    }
    return "";
  }
  const bool ids = request_.return_token_ids && !r.token_ids.empty();
  if (r.text.empty() && finish.is_null() && !request_.logprobs && !ids) return "";
  json c = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
  if (request_.endpoint == Endpoint::kChat) {
    c["delta"] = ChatDelta(choice, r.text, r.finish_reason != FinishReason::kNone);
    if (choice.calls_streamed && c["finish_reason"] == "stop" && request_.tool_mode != ToolMode::kNamed) {
      c["finish_reason"] = "tool_calls";
    }
    if (c["delta"].empty() && c["finish_reason"].is_null() && !request_.logprobs && !ids) return "";
  } else {
    c["text"] = r.text;
    if (request_.return_token_ids && !choice.prompt_ids_sent) {
      c["prompt_token_ids"] = prompts_[prompt].token_ids;
      choice.prompt_ids_sent = true;
    }
  }
  if (request_.return_token_ids) c["token_ids"] = json(r.token_ids);
  return Event(json::array({std::move(c)}), request_.include_usage);
}

json ResponseBuilder::Usage() const {
  int64_t prompt = 0, cached = 0;
  for (size_t p = 0; p < prompt_tokens_.size(); ++p) {
    prompt += prompt_tokens_[p];
    cached += cached_tokens_[p];
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string ResponseBuilder::StreamEnd() {
  std::string out;
  if (request_.include_usage) {
    json event = {{"id", id_},
                  {"object", request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", json::array()},
                  {"usage", Usage()}};
    out = absl::StrCat("data: ", Dump(event), "\n\n");
  }
  return out + "data: [DONE]\n\n";
}

std::string ResponseBuilder::Body() const {
  const bool chat = request_.endpoint == Endpoint::kChat;
  json choices = json::array();
  for (size_t c = 0; c < choices_.size(); ++c) {
    const Choice& choice = choices_[c];
    json out = {{"index", c}};
    std::string finish_reason = choice.finish_reason;
    if (chat) {
      out["message"] = ChatMessage(choice, &finish_reason);
    } else {
      out["text"] = choice.text;
    }
    out["logprobs"] = choice.logprobs;
    out["finish_reason"] = finish_reason.empty() ? json() : json(finish_reason);
    if (request_.return_token_ids) {
      if (!chat) out["prompt_token_ids"] = prompts_[c / request_.n].token_ids;
      out["token_ids"] = choice.token_ids;
    }
    choices.push_back(std::move(out));
  }
  json body = {{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", std::move(choices)},
               {"usage", Usage()}};
  // Chat's prompt is one for every choice; vLLM reports it once, at the top.
  if (chat && request_.return_token_ids) body["prompt_token_ids"] = prompts_.front().token_ids;
  return Dump(body);
}

std::string ResponseBuilder::StreamError(const absl::Status& status) {
  ApiError e = ToApiError(status);
  return absl::StrCat("data: ", e.body, "\n\ndata: [DONE]\n\n");
}

}  // namespace chunkattn::openai
