#include "services/fronts/openai/openai_server.h"

#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/constant_time.h"
#include "base/status_macros.h"

namespace chunkattn::openai {
namespace {

using json = nlohmann::json;

constexpr char kJson[] = "application/json";
constexpr int kMaxDetokenizeIds = 1 << 20;

std::string RandomId(absl::string_view prefix) { return absl::StrFormat("%s-%016x", prefix, NewRequestSeed()); }

void SendError(http::Reply& reply, const absl::Status& status) {
  ApiError e = ToApiError(status);
  reply.Send(e.http_status, kJson, std::move(e.body));
}

void SendJson(http::Reply& reply, const json& body) {
  reply.Send(200, kJson, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

// One HTTP request's engine requests (one per prompt) and its reply: the
// sinks' calls (output processor thread) and the client's disconnect (HTTP
// loop) meet here.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<http::Reply> reply, Engine* engine, ApiRequest request, std::string id,
           std::string model, std::vector<PromptEcho> prompts, const Tokenizer* tokenizer)
      : reply_(std::move(reply)),
        engine_(engine),
        request_(std::move(request)),
        builder_(request_, std::move(id), std::move(model), absl::ToUnixSeconds(absl::Now()),
                 std::move(prompts), tokenizer),
        open_(static_cast<int>(request_.prompts.size())) {}

  void Submit(std::vector<EngineRequest> requests);
  void OnOutput(int prompt, const GenerationOutput& output);
  void OnFinish(int prompt, const absl::Status& status);
  void Cancel();

 private:
  void StartStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<http::Reply> reply_;
  Engine* const engine_;
  const ApiRequest request_;
  absl::Mutex mu_;
  ResponseBuilder builder_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> ids_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the stream's headers are out
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class Sink : public ResponseSink {
 public:
  Sink(std::shared_ptr<Exchange> exchange, int prompt) : exchange_(std::move(exchange)), prompt_(prompt) {}
  void Send(GenerationOutput output) override { exchange_->OnOutput(prompt_, output); }
  void Finish(absl::Status status) override { exchange_->OnFinish(prompt_, status); }

 private:
  const std::shared_ptr<Exchange> exchange_;
  const int prompt_;
};

void Exchange::Submit(std::vector<EngineRequest> requests) {
  std::weak_ptr<Exchange> weak = weak_from_this();
  reply_->OnClose([weak] {
    if (std::shared_ptr<Exchange> self = weak.lock()) self->Cancel();
  });
  for (size_t p = 0; p < requests.size(); ++p) {
    const int64_t id = engine_->Submit(std::move(requests[p]), std::make_shared<Sink>(shared_from_this(), p));
    absl::MutexLock lock(&mu_);
    ids_.push_back(id);
    if (cancelled_) engine_->Cancel(id);
  }
}

void Exchange::StartStreamLocked() {
  if (started_) return;
  started_ = true;
  reply_->StartStream(200, "text/event-stream; charset=utf-8");
  std::string start = builder_.StreamStart();
  if (!start.empty()) reply_->Write(std::move(start));
}

void Exchange::OnOutput(int prompt, const GenerationOutput& output) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  std::string events = builder_.Add(prompt, output);
  if (!request_.stream) return;
  StartStreamLocked();
  if (!events.empty()) reply_->Write(std::move(events));
}

void Exchange::OnFinish(int, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  --open_;
  if (!status.ok()) {
    // One prompt failed: the reply fails, and the other prompts stop.
    ended_ = true;
    for (int64_t id : ids_) engine_->Cancel(id);
    if (started_) {
      reply_->Write(ResponseBuilder::StreamError(status));
      reply_->End();
    } else {
      SendError(*reply_, status);
    }
    return;
  }
  if (open_ > 0) return;
  ended_ = true;
  if (request_.stream) {
    StartStreamLocked();
    reply_->Write(builder_.StreamEnd());
    reply_->End();
  } else {
    reply_->Send(200, kJson, builder_.Body());
  }
}

void Exchange::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  ended_ = true;
  for (int64_t id : ids_) engine_->Cancel(id);
}

}  // namespace

OpenAiServer::OpenAiServer(ServerOptions options, Engine* engine, const ModelConfig* config, PromptText text,
                           TextPool* text_pool, const TokenAuth* auth, std::function<std::string()> render_metrics)
    : options_(std::move(options)),
      engine_(engine),
      config_(config),
      text_(std::move(text)),
      text_pool_(text_pool),
      auth_(auth),
      render_metrics_(std::move(render_metrics)),
      created_(absl::ToUnixSeconds(absl::Now())) {}

OpenAiServer::~OpenAiServer() = default;

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(ServerOptions options, Engine* engine,
                                                                  const ModelConfig* config, PromptText text,
                                                                  TextPool* text_pool, const TokenAuth* auth,
                                                                  std::function<std::string()> render_metrics) {
  if (options.model.name.empty()) return absl::InvalidArgumentError("openai server: no served model name");
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(std::move(options), engine, config, std::move(text),
                                                        text_pool, auth, std::move(render_metrics)));
  OpenAiServer* raw = server.get();
  http::Options http_options = server->options_.http;
  http_options.head_check = [raw](const http::RequestHead& head) { return raw->CheckHead(head); };
  absl::StatusOr<std::unique_ptr<http::HttpServer>> http = http::HttpServer::Start(
      std::move(http_options),
      [raw](http::Request request, std::shared_ptr<http::Reply> reply) { raw->Handle(std::move(request), reply); });
  if (!http.ok()) return http.status();
  server->http_ = std::move(*http);
  return server;
}

std::optional<http::Refusal> OpenAiServer::Gate(const std::string& method, const std::string& path,
                                                const std::string& authorization, Caller* caller) const {
  const bool get = method == "GET" || method == "HEAD";
  const bool post = method == "POST";
  auto refuse = [](const absl::Status& status, std::string extra_header = "") {
    ApiError e = ToApiError(status);
    return http::Refusal{e.http_status, kJson, std::move(e.body), std::move(extra_header)};
  };
  auto wrong_method = [&] {
    http::Refusal r = refuse(absl::InvalidArgumentError(absl::StrCat(method, " is not allowed on ", path)),
                             "Allow: " + std::string(get ? "POST" : "GET"));
    r.status = 405;
    return r;
  };
  if (path == "/health" || path == "/version") {
    if (!get) return wrong_method();
    return std::nullopt;
  }
  if (path == "/metrics") {
    if (!get) return wrong_method();
    if (!options_.metrics_tokens.empty()) {
      const absl::string_view presented = BearerCredential(authorization);
      bool match = false;
      for (const std::string& token : options_.metrics_tokens) {
        match |= !presented.empty() && ConstantTimeEquals(presented, token);
      }
      if (!match) return refuse(absl::UnauthenticatedError("/metrics needs a metrics bearer token"));
    }
    return std::nullopt;
  }
  const bool models = path == "/v1/models" || absl::StartsWith(path, "/v1/models/");
  const bool generates = path == "/v1/completions" || path == "/v1/chat/completions";
  if (!models && !generates && path != "/tokenize" && path != "/detokenize") {
    http::Refusal r = refuse(absl::InvalidArgumentError(absl::StrCat("no such endpoint: ", path)));
    r.status = 404;
    return r;
  }
  absl::StatusOr<Caller> who = auth_->Authorize(authorization, generates ? Permission::kGenerate : Permission::kModelInfo);
  if (!who.ok()) return refuse(who.status());
  if (models ? !get : !post) return wrong_method();
  *caller = *std::move(who);
  return std::nullopt;
}

std::optional<http::Refusal> OpenAiServer::CheckHead(const http::RequestHead& head) const {
  Caller caller;
  if (std::optional<http::Refusal> refusal = Gate(head.method, head.path, head.authorization, &caller)) {
    return refusal;
  }
  if (head.problem == 0) return std::nullopt;
  ApiError e = ToApiError(head.problem == 503 ? absl::UnavailableError(head.problem_message)
                                              : absl::InvalidArgumentError(head.problem_message));
  return http::Refusal{head.problem, kJson, std::move(e.body), ""};
}

void OpenAiServer::Handle(http::Request request, std::shared_ptr<http::Reply> reply) {
  const std::string& path = request.path;
  Caller caller;
  if (std::optional<http::Refusal> refusal = Gate(request.method, path, request.authorization, &caller)) {
    return reply->Send(refusal->status, std::move(refusal->content_type), std::move(refusal->body),
                       std::move(refusal->extra_header));
  }
  if (path == "/health") {
    if (draining_) return SendError(*reply, absl::UnavailableError("the server is shutting down"));
    if (engine_->ready()) return reply->Send(200, kJson, "{}");
    return SendError(*reply, absl::UnavailableError("the workers are not ready"));
  }
  if (path == "/version") return SendJson(*reply, {{"version", options_.version}});
  if (path == "/metrics") return reply->Send(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics_());
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
    json model = {{"id", options_.model.name},  {"object", "model"},       {"created", created_},
                  {"owned_by", "chunkattn"},    {"root", options_.model.name}, {"parent", nullptr},
                  {"max_model_len", options_.model.max_context}};
    if (path == "/v1/models") return SendJson(*reply, {{"object", "list"}, {"data", json::array({model})}});
    if (path.substr(std::string("/v1/models/").size()) != options_.model.name) {
      return SendError(*reply, absl::NotFoundError(absl::StrCat("The model `", path.substr(11), "` does not exist.")));
    }
    return SendJson(*reply, model);
  }
  std::function<void()> task;
  if (path == "/tokenize") {
    task = [this, request, reply] { Tokenize(request, reply); };
  } else if (path == "/detokenize") {
    task = [this, request, reply] { Detokenize(request, reply); };
  } else {
    const Endpoint endpoint = path == "/v1/chat/completions" ? Endpoint::kChat : Endpoint::kCompletions;
    if (!engine_->ready()) return SendError(*reply, absl::UnavailableError("the workers are not ready; retry later"));
    task = [this, endpoint, request = std::move(request), tenant = std::move(caller.tenant), reply] {
      Generate(endpoint, request, tenant, reply);
    };
  }
  if (!text_pool_->Post(std::move(task))) {
    SendError(*reply, absl::ResourceExhaustedError("too many requests are waiting to be tokenized; retry later"));
  }
}

void OpenAiServer::Generate(Endpoint endpoint, const http::Request& http_request, const std::string& tenant,
                            const std::shared_ptr<http::Reply>& reply) {
  if (reply->closed()) return;  // the client left while this waited
  absl::StatusOr<json> body = ParseBody(http_request.body);
  if (!body.ok()) return SendError(*reply, body.status());
  absl::StatusOr<ApiRequest> parsed =
      endpoint == Endpoint::kChat ? ParseChatRequest(*body, options_.model) : ParseCompletionRequest(*body, options_.model);
  if (!parsed.ok()) return SendError(*reply, parsed.status());
  body = json();  // the parsed request holds what is needed
  const std::string id = http_request.request_id.empty()
                             ? RandomId(endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl")
                             : http_request.request_id;
  std::vector<EngineRequest> requests;
  std::vector<PromptEcho> echoes(parsed->prompts.size());
  const bool several = parsed->prompts.size() > 1;
  for (size_t p = 0; p < parsed->prompts.size(); ++p) {
    ClientRequest& prompt = parsed->prompts[p];
    prompt.request_id = several ? absl::StrCat(id, "-", p) : id;
    prompt.owner = tenant;
    absl::StatusOr<EngineRequest> request = ProcessInput(prompt, *config_, text_);
    if (!request.ok()) {
      return SendError(*reply, NameOpenAiFields(request.status(), endpoint,
                                                several ? absl::StrCat("prompt[", p, "]") : "prompt",
                                                parsed->constraint_param));
    }
    if (parsed->echo) {
      if (const auto* text = std::get_if<TextPrompt>(&prompt.prompt)) {
        echoes[p].text = text->text;
      } else if (text_.tokenizer != nullptr) {
        absl::StatusOr<std::string> decoded = text_.tokenizer->Decode(request->spec.prompt);
        if (decoded.ok()) echoes[p].text = *std::move(decoded);
      }
    }
    if (parsed->return_token_ids) echoes[p].token_ids = request->spec.prompt;
    requests.push_back(*std::move(request));
  }
  auto exchange = std::make_shared<Exchange>(reply, engine_, *std::move(parsed), id, options_.model.name,
                                             std::move(echoes), text_.tokenizer);
  exchange->Submit(std::move(requests));
}

void OpenAiServer::Tokenize(const http::Request& request, const std::shared_ptr<http::Reply>& reply) {
  absl::StatusOr<json> body = ParseBody(request.body);
  if (!body.ok()) return SendError(*reply, body.status());
  if (absl::Status model = CheckModel(*body, options_.model); !model.ok()) return SendError(*reply, model);
  if (text_.tokenizer == nullptr) return SendError(*reply, absl::FailedPreconditionError("the model has no tokenizer"));
  std::vector<int32_t> ids;
  if (body->contains("messages")) {
    absl::StatusOr<ApiRequest> chat = ParseChatRequest(*body, options_.model);
    if (!chat.ok()) return SendError(*reply, chat.status());
    absl::StatusOr<PromptTokens> tokens =
        TokenizeChatPrompt(std::get<ChatPrompt>(chat->prompts.front().prompt), text_, *config_);
    if (!tokens.ok()) return SendError(*reply, NameOpenAiFields(tokens.status(), Endpoint::kChat));
    ids = std::move(tokens->ids);
  } else {
    const json& prompt = body->value("prompt", json());
    if (!prompt.is_string()) return SendError(*reply, InvalidParam("prompt", "'prompt' must be a string"));
    const json& add_special = body->value("add_special_tokens", json(true));
    if (!add_special.is_boolean()) {
      return SendError(*reply, InvalidParam("add_special_tokens", "'add_special_tokens' must be a boolean"));
    }
    const std::string& text = prompt.get_ref<const std::string&>();
    if (text.size() > MaxTextBytes(*config_)) {
      return SendError(*reply, InvalidParam("prompt", absl::StrFormat("'prompt' has %d bytes; at most %d", text.size(),
                                                                      MaxTextBytes(*config_))));
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        text_.tokenizer->Encode(text, add_special.get<bool>() && text_.tokenizer->bos_id() >= 0);
    if (!encoded.ok()) return SendError(*reply, InvalidParam("prompt", encoded.status().message()));
    ids = std::move(*encoded);
  }
  SendJson(*reply, {{"count", ids.size()},
                    {"max_model_len", options_.model.max_context},
                    {"tokens", ids},
                    {"token_strs", nullptr}});
}

void OpenAiServer::Detokenize(const http::Request& request, const std::shared_ptr<http::Reply>& reply) {
  absl::StatusOr<json> body = ParseBody(request.body);
  if (!body.ok()) return SendError(*reply, body.status());
  if (absl::Status model = CheckModel(*body, options_.model); !model.ok()) return SendError(*reply, model);
  if (text_.tokenizer == nullptr) return SendError(*reply, absl::FailedPreconditionError("the model has no tokenizer"));
  const json& tokens = body->value("tokens", json());
  if (!tokens.is_array() || tokens.size() > static_cast<size_t>(kMaxDetokenizeIds)) {
    return SendError(*reply, InvalidParam("tokens", absl::StrFormat("'tokens' must be an array of at most %d token ids",
                                                                    kMaxDetokenizeIds)));
  }
  std::vector<int32_t> ids;
  for (const json& t : tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= text_.tokenizer->vocab_size()) {
      return SendError(*reply, InvalidParam("tokens", absl::StrFormat("'tokens' must hold ids in [0, %d)",
                                                                      text_.tokenizer->vocab_size())));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  absl::StatusOr<std::string> text = text_.tokenizer->Decode(ids);
  if (!text.ok()) return SendError(*reply, InvalidParam("tokens", text.status().message()));
  SendJson(*reply, {{"prompt", *text}});
}

}  // namespace chunkattn::openai
