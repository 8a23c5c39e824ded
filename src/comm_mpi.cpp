// The MPI backend of the Communicator (comm.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <utility>

#include "hpc_train/comm.h"
#include "hpc_train/error.h"

namespace hpc_train {

namespace {

// MPI has no 16-bit floating-point types: half and bfloat16 travel as a 2-byte type of ours and
// are reduced by operations of ours that compute in float.
template <typename Half>
void reduce_16bit(void* in, void* inout, int* count, MPI_Datatype*, ReduceOp op) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *count; ++i) {
    const float x = static_cast<float>(a[i]);
    const float y = static_cast<float>(b[i]);
    b[i] = static_cast<Half>(op == ReduceOp::kSum ? x + y : op == ReduceOp::kMax ? std::max(x, y)
                                                                                  : std::min(x, y));
  }
}

template <typename Half, ReduceOp kOp>
void reduce_16bit_entry(void* in, void* inout, int* count, MPI_Datatype* type) {
  reduce_16bit<Half>(in, inout, count, type, kOp);
}

struct SixteenBitTypes {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op half_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bfloat16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

// Created once, on first use; freed by MPI_Finalize.
const SixteenBitTypes& sixteen_bit_types() {
  static const SixteenBitTypes types = [] {
    SixteenBitTypes t;
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.type));
    MPI_CHECK(MPI_Type_commit(&t.type));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::Half, ReduceOp::kSum>, 1, &t.half_ops[0]));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::Half, ReduceOp::kMax>, 1, &t.half_ops[1]));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::Half, ReduceOp::kMin>, 1, &t.half_ops[2]));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::BFloat16, ReduceOp::kSum>, 1, &t.bfloat16_ops[0]));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::BFloat16, ReduceOp::kMax>, 1, &t.bfloat16_ops[1]));
    MPI_CHECK(MPI_Op_create(&reduce_16bit_entry<c10::BFloat16, ReduceOp::kMin>, 1, &t.bfloat16_ops[2]));
    return t;
  }();
  return types;
}

MPI_Datatype mpi_datatype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kHalf:
    case at::kBFloat16: return sixteen_bit_types().type;
    default:
      throw Error(std::string("MPI backend: no MPI datatype for tensors of ") +
                  c10::toString(tensor.scalar_type()));
  }
}

int op_index(ReduceOp op) { return op == ReduceOp::kSum ? 0 : op == ReduceOp::kMax ? 1 : 2; }

MPI_Op mpi_op(ReduceOp op) {
  const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return builtin[op_index(op)];
}

MPI_Op mpi_op(ReduceOp op, const at::Tensor& tensor) {
  if (tensor.scalar_type() == at::kHalf) return sixteen_bit_types().half_ops[op_index(op)];
  if (tensor.scalar_type() == at::kBFloat16) return sixteen_bit_types().bfloat16_ops[op_index(op)];
  return mpi_op(op);
}

// MPI counts are int.
int mpi_count(int64_t numel, const char* operation) {
  if (numel > std::numeric_limits<int>::max())
    throw Error(std::string("MPI backend: ") + operation + " of " + std::to_string(numel) +
                " elements exceeds MPI's int count; use smaller buckets (--bucket-mb)");
  return static_cast<int>(numel);
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
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), mpi_count(tensor.numel(), "all_reduce"),
                           mpi_datatype(tensor), mpi_op(op, tensor), comm_, &request));
  return Work(request);
}

Work Communicator::broadcast(at::Tensor& tensor, int root) {
  check_host_contiguous(tensor, "broadcast");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(tensor.data_ptr(), mpi_count(tensor.numel(), "broadcast"),
                       mpi_datatype(tensor), root, comm_, &request));
  return Work(request);
}

Work Communicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  check_host_contiguous(input, "reduce_scatter");
  check_host_contiguous(output, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error("MPI backend: reduce_scatter needs input of size() x output elements, one dtype");
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(),
                                      mpi_count(output.numel(), "reduce_scatter"),
                                      mpi_datatype(input), mpi_op(op, input), comm_, &request));
  return Work(request);
}

Work Communicator::all_gather_in_place(at::Tensor& buffer) {
  check_host_contiguous(buffer, "all_gather");
  if (buffer.numel() % size_ != 0)
    throw Error("MPI backend: all_gather needs a buffer of size() equal slices");
  MPI_Request request = MPI_REQUEST_NULL;
  const int slice = mpi_count(buffer.numel() / size_, "all_gather");
  MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data_ptr(), slice,
                           mpi_datatype(buffer), comm_, &request));
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
