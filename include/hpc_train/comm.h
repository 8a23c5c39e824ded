// The Communicator: collectives over the ranks of one MPI communicator, on tensors.
//
// Operations are asynchronous and return a `Work` handle (wait / test), so that a caller can
// start a reduction and do something else meanwhile. Two backends, chosen in one place
// (Communicator's constructor):
//   mpi   MPI's non-blocking collectives on host memory. GPU tensors are staged through pinned
//         host buffers (the MPI we target is not CUDA-aware): copied to the host when the
//         operation starts, and back when the Work completes. (comm_mpi.cpp)
//   nccl  NCCL on GPU tensors, on a communication stream of its own: an operation first waits
//         (on the GPU) for the work queued so far on the caller's stream, and Work::wait makes
//         the caller's stream wait for the operation; the host never blocks inside a step.
//         Built only when LibTorch has CUDA. (comm_nccl.cpp)
// Scalars and flags always go through MPI on the host.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hpc_train {

enum class ReduceOp { kSum, kMax, kMin };
enum class CommBackendKind { kMpi, kNccl };

// "mpi" | "nccl" -> the kind; ConfigError otherwise.
CommBackendKind parse_comm_backend(const std::string& name);
// Whether this build can run NCCL (LibTorch with CUDA).
bool nccl_available();

// A collective in flight. Non-copyable, movable; waits in its destructor if nobody did, so
// that a buffer is never released while a collective still writes to it (and never throws there).
class Work {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;  // MPI: blocks; NCCL: orders the caller's stream after the operation
    virtual bool test() = 0;  // true once done
  };

  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  ~Work();
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();  // throws Error on failure
  bool test();

 private:
  std::unique_ptr<Impl> impl_;
};

// One backend's tensor collectives (see the top of this file).
class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual Work all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  virtual Work broadcast(at::Tensor& tensor, int root) = 0;
  virtual Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  virtual Work all_gather_in_place(at::Tensor& buffer) = 0;
};

class Communicator {
 public:
  // Does not take ownership of `comm` (MPI_COMM_WORLD, MPI_COMM_SELF, or a caller's).
  // kNccl creates an NCCL communicator over the same ranks (collective), on GPU `cuda_device`.
  explicit Communicator(MPI_Comm comm, CommBackendKind backend = CommBackendKind::kMpi,
                        int cuda_device = 0);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }
  CommBackendKind backend() const { return kind_; }

  // Tensors are contiguous, of float, double, int32, int64, half or bfloat16 (with MPI, half
  // and bfloat16 are summed in float by an MPI operation of ours); on the host or a GPU with
  // MPI, on the GPU with NCCL.

  // In place.
  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) {
    return backend_->all_reduce(tensor, op);
  }
  Work broadcast(at::Tensor& tensor, int root) { return backend_->broadcast(tensor, root); }
  // `input` has size() equal slices; this rank's reduced slice lands in `output`
  // (input.numel() / size() elements).
  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::kSum) {
    return backend_->reduce_scatter(input, output, op);
  }
  // In place: `buffer` has size() equal slices, this rank's own is at rank() * slice; afterwards
  // every slice holds its rank's data.
  Work all_gather_in_place(at::Tensor& buffer) { return backend_->all_gather_in_place(buffer); }

  // Small blocking reductions for scalars and flags (loss sums, counts, agreement), over MPI.
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::kSum);
  int64_t all_reduce_count(int64_t value, ReduceOp op = ReduceOp::kSum);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  CommBackendKind kind_;
  std::unique_ptr<CommBackend> backend_;
};

// The backends' factories (comm_mpi.cpp, comm_nccl.cpp).
std::unique_ptr<CommBackend> make_mpi_backend(MPI_Comm comm);
std::unique_ptr<CommBackend> make_nccl_backend(MPI_Comm comm, int cuda_device);

}  // namespace hpc_train
