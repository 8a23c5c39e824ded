// The Communicator: collectives over the ranks of one MPI communicator, on tensors.
//
// Operations are asynchronous and return a `Work` handle (wait / test), so that a caller can
// start a reduction and do something else meanwhile. This is the MPI backend: MPI's
// non-blocking collectives on host memory. GPU tensors are staged through pinned host buffers
// (the MPI we target is not CUDA-aware): copied to the host when the operation starts, and back
// when the Work completes.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <functional>

namespace hpc_train {

enum class ReduceOp { kSum, kMax, kMin };

// A collective in flight. Non-copyable, movable; waits in its destructor if nobody did, so
// that a buffer is never released while MPI still writes to it (and never throws there).
class Work {
 public:
  Work() = default;
  // `on_complete` runs once, when the request is seen complete (e.g. copies a staged result back).
  explicit Work(MPI_Request request, std::function<void()> on_complete = {})
      : request_(request), on_complete_(std::move(on_complete)) {}
  ~Work();
  Work(Work&& other) noexcept;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();  // blocks until done; throws Error on failure
  bool test();  // true once done

 private:
  void complete();

  MPI_Request request_ = MPI_REQUEST_NULL;
  std::function<void()> on_complete_;
};

class Communicator {
 public:
  // Does not take ownership of `comm` (MPI_COMM_WORLD, MPI_COMM_SELF, or a caller's).
  explicit Communicator(MPI_Comm comm);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }

  // Tensors are contiguous, of float, double, int32, int64, half or bfloat16 (half and
  // bfloat16 are summed in float by an MPI operation of ours), on the host or a GPU.

  // In place.
  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  Work broadcast(at::Tensor& tensor, int root);
  // `input` has size() equal slices; this rank's reduced slice lands in `output`
  // (input.numel() / size() elements).
  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::kSum);
  // In place: `buffer` has size() equal slices, this rank's own is at rank() * slice; afterwards
  // every slice holds its rank's data.
  Work all_gather_in_place(at::Tensor& buffer);

  // Small blocking reductions for scalars and flags (loss sums, counts, agreement).
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::kSum);
  int64_t all_reduce_count(int64_t value, ReduceOp op = ReduceOp::kSum);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace hpc_train
