// The MPI backend of the Communicator (comm.h).
#include <ATen/ATen.h>

#include <exception>
#include <utility>

#include "hpc_train/comm.h"
#include "hpc_train/error.h"

namespace hpc_train {

namespace {

MPI_Datatype mpi_datatype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    default:
      throw Error(std::string("MPI backend: no MPI datatype for tensors of ") +
                  c10::toString(tensor.scalar_type()));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

void check_host_contiguous(const at::Tensor& tensor, const char* operation) {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous())
    throw Error(std::string("MPI backend: ") + operation +
                " needs a defined, contiguous tensor in host memory");
}

}  // namespace

Work::~Work() {
  // While an exception unwinds, the other ranks may never join this collective: waiting would
  // hang the job instead of letting run_or_abort end it (Note [Ending the job]).
  if (request_ != MPI_REQUEST_NULL && std::uncaught_exceptions() == 0)
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
}

Work::Work(Work&& other) noexcept : request_(std::exchange(other.request_, MPI_REQUEST_NULL)) {}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
  }
  return *this;
}

void Work::wait() {
  if (request_ != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
}

bool Work::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

Communicator::Communicator(MPI_Comm comm) : comm_(comm) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

Work Communicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  check_host_contiguous(tensor, "all_reduce");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                           mpi_datatype(tensor), mpi_op(op), comm_, &request));
  return Work(request);
}

Work Communicator::broadcast(at::Tensor& tensor, int root) {
  check_host_contiguous(tensor, "broadcast");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(tensor.data_ptr(), static_cast<int>(tensor.numel()), mpi_datatype(tensor),
                       root, comm_, &request));
  return Work(request);
}

double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  double result = value;
  MPI_CHECK(MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, mpi_op(op), comm_));
  return result;
}

int64_t Communicator::all_reduce_count(int64_t value, ReduceOp op) {
  int64_t result = value;
  MPI_CHECK(MPI_Allreduce(&value, &result, 1, MPI_INT64_T, mpi_op(op), comm_));
  return result;
}

}  // namespace hpc_train
