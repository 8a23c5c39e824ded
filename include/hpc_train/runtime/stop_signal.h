// Preemption: SIGUSR1 or SIGTERM asks the run to checkpoint and stop.
//
// The handler only records the signal (async-signal-safe: one sig_atomic_t). The trainer looks
// at the record at every step boundary and the ranks agree on it with a collective, so that all
// of them stop after the same step, write one checkpoint together and exit with kExitPreempted
// (error.h). A signal on any one rank is enough: Open MPI's mpirun forwards SIGUSR1 to every
// rank, while srun or a scheduler may signal only some of them.
#pragma once

namespace hpc_train {

// Installs the handlers for SIGUSR1 and SIGTERM (replacing the defaults, which end the process).
void install_stop_signal_handlers();

// The signal that asked this process to stop (SIGUSR1 or SIGTERM), or 0 when none has.
int stop_signal_received();

// "SIGUSR1" / "SIGTERM" / "signal N".
const char* stop_signal_name(int signal_number);

}  // namespace hpc_train
