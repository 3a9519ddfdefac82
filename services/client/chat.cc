#include "services/client/chat.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "chunkattn/v1/generation.grpc.pb.h"

namespace chunkattn::client {
namespace {

// One line of `in` without its newline; false at end of input.
bool ReadLine(std::FILE* in, std::string* line) {
  line->clear();
  int c;
  while ((c = std::fgetc(in)) != EOF) {
    if (c == '\n') return true;
    line->push_back(static_cast<char>(c));
  }
  return !line->empty();
}

}  // namespace

int RunChat(const ChatOptions& options, std::FILE* in) {
  const bool interactive = isatty(fileno(in)) && isatty(fileno(stdout));
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(MakeChannel(options.channel));
  v1::ChatPrompt history;
  history.set_template_kwargs_json(options.template_kwargs_json);
  auto reset = [&] {
    history.clear_messages();
    if (!options.system.empty()) {
      v1::ChatMessage* m = history.add_messages();
      m->set_role("system");
      m->set_content(options.system);
    }
  };
  reset();
  if (interactive) std::fputs("chunkattn chat: /reset starts over, /exit or Ctrl-D ends\n", stderr);
  int exit_code = 0;
  int turn = 0;
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!ReadLine(in, &line)) break;
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty()) continue;
    if (text == "/exit") break;
    if (text == "/reset") {
      reset();
      turn = 0;
      std::fputs("[conversation reset]\n", stderr);
      continue;
    }
    v1::GenerateRequest request;
    *request.mutable_chat() = history;
    v1::ChatMessage* user = request.mutable_chat()->add_messages();
    user->set_role("user");
    user->set_content(text);
    *request.mutable_sampling() = options.sampling;
    *request.mutable_stopping() = options.stopping;
    request.set_cache_namespace(options.cache_namespace);

    grpc::ClientContext ctx;
    SetDeadline(&ctx, options.timeout_s);
    auto reader = stub->Generate(&ctx, request);
    v1::GenerateResponse response;
    std::string reply;
    v1::Usage usage;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    while (reader->Read(&response)) {
      std::fwrite(response.text().data(), 1, response.text().size(), stdout);
      std::fflush(stdout);
      reply += response.text();
      if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finish = response.finish_reason();
        usage = response.usage();
      }
    }
    const grpc::Status status = reader->Finish();
    if (reply.empty() || reply.back() != '\n') std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!status.ok()) {
      PrintRpcError(status);
      exit_code = 1;
      continue;  // the history stays as it was before this turn
    }
    ++turn;
    *history.add_messages() = *user;
    v1::ChatMessage* assistant = history.add_messages();
    assistant->set_role("assistant");
    assistant->set_content(reply);
    const double reused = usage.prompt_tokens() > 0 ? 100.0 * usage.cached_prompt_tokens() / usage.prompt_tokens() : 0;
    std::fprintf(stderr,
                 "[turn %d: finish=%s prompt_tokens=%u cached_prompt_tokens=%u (%.0f%% of the prompt reused from "
                 "the cache%s) completion_tokens=%u]\n",
                 turn, FinishReasonName(finish).c_str(), usage.prompt_tokens(), usage.cached_prompt_tokens(), reused,
                 turn > 1 ? ": the conversation so far" : "", usage.completion_tokens());
  }
  return exit_code;
}

}  // namespace chunkattn::client
