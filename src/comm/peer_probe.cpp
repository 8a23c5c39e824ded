// Note [Naming a lost peer] (peer_probe.h): a listening socket per rank, probed when the job ends.
#include "hpc_train/comm/peer_probe.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "hpc_train/error.h"

namespace hpc_train {
namespace {

// One rank's record in the exchange: "host\nport\naddress address ...", NUL-padded.
constexpr int kRecordBytes = 1024;
constexpr char kLoopback[] = "127.0.0.1";

// The IPv4 addresses of this host's interfaces that are up, loopback last (the only one on a
// machine without a network, and what ranks of one host reach each other by).
std::vector<std::string> local_addresses() {
  std::vector<std::string> addresses;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) ||
          (a->ifa_flags & IFF_LOOPBACK))
        continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) addresses.emplace_back(text);
    }
    freeifaddrs(list);
  }
  addresses.emplace_back(kLoopback);
  return addresses;
}

// A socket listening on every IPv4 address at a port the kernel picks; -1 where that fails.
int open_listening_socket(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(address.sin_port);
  return fd;
}

}  // namespace

PeerProbe::PeerProbe(MPI_Comm comm) {
  int size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  int port = 0;
  listening_fd_ = size > 1 ? open_listening_socket(&port) : -1;

  std::string record = std::string(host) + "\n" + std::to_string(port) + "\n";
  for (const std::string& address : local_addresses()) {
    if (record.size() + address.size() + 1 >= kRecordBytes) break;
    record += address + " ";
  }
  record.resize(kRecordBytes, '\0');
  std::vector<char> all(static_cast<size_t>(kRecordBytes) * size);
  MPI_CHECK(MPI_Allgather(record.data(), kRecordBytes, MPI_CHAR, all.data(), kRecordBytes,
                          MPI_CHAR, comm));
  peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    const char* begin = all.data() + static_cast<size_t>(r) * kRecordBytes;
    std::istringstream in(std::string(begin, strnlen(begin, kRecordBytes)));
    Peer& peer = peers_[r];
    std::getline(in, peer.host);
    std::string port_text;
    std::getline(in, port_text);
    peer.port = std::atoi(port_text.c_str());
    for (std::string address; in >> address;) peer.addresses.push_back(address);
  }
}

PeerProbe::~PeerProbe() {
  if (listening_fd_ >= 0) close(listening_fd_);
}

void PeerProbe::close_for_test() {
  if (listening_fd_ >= 0) close(listening_fd_);
  listening_fd_ = -1;
}

std::vector<PeerProbe::Silent> PeerProbe::silent_peers(std::chrono::milliseconds limit) const {
  // Every connection at once, non-blocking; a rank answers when one of its addresses does.
  struct Attempt {
    int rank;
    int fd;
  };
  std::vector<Attempt> attempts;
  std::vector<bool> answered(peers_.size(), false);
  std::vector<std::string> refusal(peers_.size());
  const std::string& my_host = peers_[rank_].host;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == rank_ || peers_[r].port == 0) continue;
    for (const std::string& text : peers_[r].addresses) {
      // Loopback reaches a peer only on this host; elsewhere it would reach this host itself.
      if (text == kLoopback && peers_[r].host != my_host) continue;
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(peers_[r].port));
      if (inet_pton(AF_INET, text.c_str(), &address.sin_addr) != 1) continue;
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
        answered[r] = true;
        close(fd);
      } else if (errno == EINPROGRESS) {
        attempts.push_back({r, fd});
      } else {
        refusal[r] = std::strerror(errno);
        close(fd);
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<pollfd> waiting;
  for (;;) {
    waiting.clear();
    for (const Attempt& a : attempts)
      if (a.fd >= 0 && !answered[a.rank]) waiting.push_back({a.fd, POLLOUT, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (waiting.empty() || left.count() <= 0) break;
    if (poll(waiting.data(), waiting.size(), static_cast<int>(left.count())) <= 0) continue;
    for (Attempt& a : attempts) {
      if (a.fd < 0) continue;
      for (const pollfd& p : waiting) {
        if (p.fd != a.fd || p.revents == 0) continue;
        int error = 0;
        socklen_t length = sizeof error;
        getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error == 0) answered[a.rank] = true;
        else refusal[a.rank] = std::strerror(error);
        close(a.fd);
        a.fd = -1;
      }
    }
  }
  for (const Attempt& a : attempts)
    if (a.fd >= 0) close(a.fd);

  char limit_text[32];
  std::snprintf(limit_text, sizeof limit_text, "%g", limit.count() / 1e3);
  std::vector<Silent> silent;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == rank_ || peers_[r].port == 0 || answered[r]) continue;
    silent.push_back({r, peers_[r].host,
                      refusal[r].empty() ? std::string("no answer within ") + limit_text + " s"
                                         : refusal[r]});
  }
  return silent;
}

std::string PeerProbe::describe(std::chrono::milliseconds limit) const {
  if (peers_.size() < 2 || listening_fd_ < 0) return {};
  const std::vector<Silent> silent = silent_peers(limit);
  if (silent.empty()) return "; every other rank answers on the network";
  std::string text;
  for (const Silent& s : silent)
    text += (text.empty() ? "; " : ", ") + std::string("rank ") + std::to_string(s.rank) + "@" +
            s.host + " does not answer (" + s.why + ")";
  return text;
}

}  // namespace hpc_train
