#include "hpc_train/runtime/stop_signal.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal_number) { g_stop_signal = signal_number; }

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: a read or an MPI progress call must not fail with EINTR
  // because a signal arrived in the middle of it.
  action.sa_flags = SA_RESTART;
  for (int signal_number : {SIGUSR1, SIGTERM})
    if (sigaction(signal_number, &action, nullptr) != 0)
      throw Error(std::string("sigaction(") + stop_signal_name(signal_number) +
                  ") failed: " + std::strerror(errno));
}

int stop_signal_received() { return g_stop_signal; }

const char* stop_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    default: {
      static thread_local char text[24];
      std::snprintf(text, sizeof text, "signal %d", signal_number);
      return text;
    }
  }
}

}  // namespace hpc_train
