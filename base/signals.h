// SIGTERM and SIGINT for the servers, without unsafe work in a handler: the
// handler only write()s the signal number to a pipe (async-signal-safe), and
// an ordinary thread blocked in WaitForTerminationSignal reads it and then
// shuts down with whatever calls it needs (locks, gRPC, joins). A self-pipe
// rather than sigwait, because threads that libraries start before main
// (OpenBLAS's) do not block the signals and could take them.
#ifndef CHUNKATTN_BASE_SIGNALS_H_
#define CHUNKATTN_BASE_SIGNALS_H_

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace chunkattn {

inline int g_termination_pipe[2] = {-1, -1};

extern "C" inline void OnTerminationSignal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  (void)!write(g_termination_pipe[1], &c, 1);
  errno = saved;
}

// Installs the handlers. Call once, from main, before anything may signal.
// False (errno set) if the pipe or a handler cannot be made.
inline bool InstallTerminationHandlers() {
  if (g_termination_pipe[0] < 0 && pipe2(g_termination_pipe, O_CLOEXEC) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = OnTerminationSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0;
}

// Blocks until SIGTERM or SIGINT arrives (after InstallTerminationHandlers);
// returns its number.
inline int WaitForTerminationSignal() {
  char c = 0;
  for (;;) {
    const ssize_t n = read(g_termination_pipe[0], &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno != EINTR) return SIGTERM;  // the pipe is gone: stop anyway
  }
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_SIGNALS_H_
