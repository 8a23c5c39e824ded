// The Communicator's backend-independent half: Work, the choice of backend, scalars are in
// comm_mpi.cpp.
#include "hpc_train/comm.h"

#include <exception>

#include "hpc_train/error.h"

namespace hpc_train {

CommBackendKind parse_comm_backend(const std::string& name) {
  if (name == "mpi") return CommBackendKind::kMpi;
  if (name == "nccl") return CommBackendKind::kNccl;
  throw ConfigError("--backend " + name + ": use mpi, nccl or auto");
}

bool nccl_available() {
#ifdef HPC_TRAIN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Work::~Work() {
  // While an exception unwinds, the other ranks may never join this collective: waiting would
  // hang the job instead of letting run_or_abort end it (Note [Ending the job]).
  if (!impl_ || std::uncaught_exceptions() > 0) return;
  try {
    impl_->wait();
  } catch (...) {  // destructors never throw
  }
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    Work finished(std::move(*this));  // waits for ours
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Work::wait() {
  if (impl_) impl_->wait();
}

bool Work::test() { return !impl_ || impl_->test(); }

Communicator::Communicator(MPI_Comm comm, CommBackendKind backend, int cuda_device)
    : comm_(comm), kind_(backend) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (backend == CommBackendKind::kMpi) {
    backend_ = make_mpi_backend(comm_);
  } else {
#ifdef HPC_TRAIN_WITH_CUDA
    backend_ = make_nccl_backend(comm_, cuda_device);
#else
    (void)cuda_device;
    throw ConfigError("--backend nccl: this hpc_train was built with a LibTorch without CUDA");
#endif
  }
}

Communicator::~Communicator() = default;

}  // namespace hpc_train
