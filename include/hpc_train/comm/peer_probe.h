// Which ranks still answer on the network: what the communication watchdog adds to its message
// when a collective stalls, so that a lost node is named rather than guessed at.
//
// Note [Naming a lost peer]
// A collective that stalls because a node died or lost its link looks the same from every
// surviving rank: each waits for data that never comes, and MPI does not say from whom. So at
// start-up every rank opens a TCP socket that listens on every address of its host (port chosen
// by the kernel) and never accepts: the kernel completes a connection to a listening socket by
// itself, so a connect() succeeds exactly while the process lives and its host is reachable.
// The ranks exchange their host names, addresses and ports (one MPI_Allgather). When the
// watchdog ends the job it connects to every other rank with a short time limit, all at once,
// and names those that did not answer ("rank 2@node3: no answer within 2 s" for a cut link or a
// node gone; "connection refused" for a process gone from a live host). A rank behind a cut link
// names every other rank instead: each side says what it sees. The probes are a handful of TCP
// handshakes once, when the job is ending anyway; nothing runs while training.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

namespace hpc_train {

class PeerProbe {
 public:
  // Collective over `comm`. Where no socket can be opened (no network at all), the probe knows
  // nothing and reports nothing; it never fails the job.
  explicit PeerProbe(MPI_Comm comm);
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  struct Silent {
    int rank;
    std::string host;
    std::string why;  // "no answer within 2 s", "connection refused"
  };
  // The other ranks that do not accept a connection on any of their addresses within `limit`.
  std::vector<Silent> silent_peers(std::chrono::milliseconds limit) const;

  // For the watchdog's message: "; rank 2@node3 does not answer (no answer within 2 s)", or
  // "; every other rank answers" (then a rank skipped a collective or is stuck in its own
  // work); empty for one rank or without sockets.
  std::string describe(std::chrono::milliseconds limit) const;

  // Tests: stop answering, as a process that is gone does.
  void close_for_test();

 private:
  struct Peer {
    std::string host;
    std::vector<std::string> addresses;  // numeric IPv4/IPv6
    int port = 0;                        // 0: that rank has no socket
  };
  int rank_ = 0;
  int listening_fd_ = -1;
  std::vector<Peer> peers_;  // by rank
};

}  // namespace hpc_train
