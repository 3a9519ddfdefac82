// `chunkattn chat`: an interactive conversation with a coordinator's model,
// rendered by the model's chat template on the server (GenerateRequest.chat).
// Each line read is a user message; the reply streams to stdout and joins the
// history, so the next turn sends the whole conversation, whose prefix the
// server's cache already holds. After each reply, stderr gets the turn's
// usage and how much of its prompt came from the cache.
//
// Lines "/reset" (start over) and "/exit" are commands; end of input ends the
// chat. A turn that fails prints the error and leaves the history as it was.
#ifndef CHUNKATTN_SERVICES_CLIENT_CHAT_H_
#define CHUNKATTN_SERVICES_CLIENT_CHAT_H_

#include <cstdio>
#include <string>

#include "chunkattn/v1/generation.pb.h"
#include "services/client/client.h"

namespace chunkattn::client {

struct ChatOptions {
  ChannelOptions channel;
  double timeout_s = 600;  // per turn
  std::string system;      // empty: no system message
  std::string template_kwargs_json;
  std::string cache_namespace;
  v1::SamplingParams sampling;
  v1::StoppingCriteria stopping;
};

// Runs the conversation over `in`; returns the exit code (0, or 1 when a
// turn failed). REQUIRES: the options were validated (see main.cc).
int RunChat(const ChatOptions& options, std::FILE* in);

}  // namespace chunkattn::client

#endif  // CHUNKATTN_SERVICES_CLIENT_CHAT_H_
