// The MPI backend of the Communicator (comm.h): non-blocking MPI collectives on host memory.
#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "comm/comm_backend.h"
#include "hpc_train/comm/comm.h"
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

void check_contiguous(const at::Tensor& tensor, const char* operation) {
  if (!tensor.defined() || !tensor.is_contiguous())
    throw Error(std::string("MPI backend: ") + operation + " needs a defined, contiguous tensor");
}

// Host memory MPI can use for `tensor`: the tensor itself on the host, else a pinned host copy
// (with the tensor's contents when `copy_in`).
at::Tensor host_buffer(const at::Tensor& tensor, bool copy_in) {
  if (tensor.device().is_cpu()) return tensor;
  at::Tensor host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
  if (copy_in) host.copy_(tensor);
  return host;
}

// What a Work must do on completion for a staged result: copy it back to the device.
std::function<void()> copy_back(const at::Tensor& device_tensor, const at::Tensor& host) {
  if (device_tensor.device().is_cpu()) return {};
  return [device_tensor, host]() mutable { device_tensor.copy_(host); };
}


// An MPI request, and what to do once it completes (copy a staged result back). When watched,
// it tells the watchdog of completion, and waits by polling so that it can end the job itself
// once the operation is overdue (Note [Communication watchdog]): MPI_Wait cannot be given up.
class MpiWork : public Work::Impl {
 public:
  MpiWork(MPI_Request request, std::function<void()> on_complete,
          std::shared_ptr<WatchedOperation> watched, std::weak_ptr<CommWatchdog> watchdog)
      : request_(request), on_complete_(std::move(on_complete)), watched_(std::move(watched)),
        watchdog_(std::move(watchdog)) {}
  // Dropped unfinished (an exception unwinds): nobody waits for it any more, so it is no
  // longer the watchdog's business.
  ~MpiWork() override {
    if (watched_) watched_->mark_finished();
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) {
      if (watched_) {
        while (!test_request()) {
          if (const std::shared_ptr<CommWatchdog> watchdog = watchdog_.lock();
              watchdog && watchdog->overdue(*watched_))
            watchdog->end_job(watchdog->stall_message(*watched_));
          std::this_thread::yield();
        }
      } else {
        MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
      }
    }
    complete();
  }
  bool test() override {
    if (!test_request()) return false;
    complete();
    return true;
  }

 private:
  bool test_request() {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }
  void complete() {
    if (watched_) watched_->mark_finished();
    if (on_complete_) std::exchange(on_complete_, nullptr)();
  }
  MPI_Request request_;
  std::function<void()> on_complete_;
  std::shared_ptr<WatchedOperation> watched_;
  std::weak_ptr<CommWatchdog> watchdog_;
};

// A Work for a started request; registered with `watchdog` when there is one.
Work make_work(MPI_Request request, const std::shared_ptr<CommWatchdog>& watchdog,
               const char* name, const std::string& label, int64_t bytes,
               std::function<void()> on_complete = {}) {
  std::shared_ptr<WatchedOperation> watched;
  if (watchdog) {
    watched = std::make_shared<WatchedOperation>("mpi", name, label, bytes);
    watchdog->watch(watched);
  }
  return Work(std::make_unique<MpiWork>(request, std::move(on_complete), std::move(watched),
                                        watchdog));
}

int64_t bytes_of(const at::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

class MpiBackend : public CommBackend {
 public:
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  Work all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& label) override;
  Work broadcast(at::Tensor& tensor, int root, const std::string& label) override;
  Work reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                      const std::string& label) override;
  Work all_gather_in_place(at::Tensor& buffer, const std::string& label) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

Work MpiBackend::all_reduce(at::Tensor& tensor, ReduceOp op, const std::string& label) {
  check_contiguous(tensor, "all_reduce");
  at::Tensor host = host_buffer(tensor, /*copy_in=*/true);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, host.data_ptr(), mpi_count(host.numel(), "all_reduce"),
                           mpi_datatype(host), mpi_op(op, host), comm_, &request));
  return make_work(request, watchdog(), "all_reduce", label, bytes_of(tensor),
                   copy_back(tensor, host));
}

Work MpiBackend::broadcast(at::Tensor& tensor, int root, const std::string& label) {
  check_contiguous(tensor, "broadcast");
  at::Tensor host = host_buffer(tensor, /*copy_in=*/rank_ == root);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(host.data_ptr(), mpi_count(host.numel(), "broadcast"), mpi_datatype(host),
                       root, comm_, &request));
  return make_work(request, watchdog(), "broadcast", label, bytes_of(tensor),
                   copy_back(tensor, host));
}

Work MpiBackend::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                                const std::string& label) {
  check_contiguous(input, "reduce_scatter");
  check_contiguous(output, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error("MPI backend: reduce_scatter needs input of size() x output elements, one dtype");
  // In place (the output is this rank's slice of the input): nothing moves with one rank; else
  // MPI, which allows no aliased buffers, gets a copy of the input.
  const bool in_place = output.data_ptr() == static_cast<char*>(input.data_ptr()) +
                                                 rank_ * output.numel() * output.element_size();
  if (in_place && size_ == 1) return Work();
  const at::Tensor host_input =
      in_place && input.device().is_cpu() ? input.clone() : host_buffer(input, /*copy_in=*/true);
  at::Tensor host_output = host_buffer(output, /*copy_in=*/false);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ireduce_scatter_block(host_input.data_ptr(), host_output.data_ptr(),
                                      mpi_count(output.numel(), "reduce_scatter"),
                                      mpi_datatype(host_input), mpi_op(op, host_input), comm_,
                                      &request));
  // The input (or its staged copy) must outlive the collective: the completion holds it.
  std::function<void()> copy_result = copy_back(output, host_output);
  std::function<void()> finish = [copy_result, host_input] { if (copy_result) copy_result(); };
  return make_work(request, watchdog(), "reduce_scatter", label, bytes_of(input),
                   std::move(finish));
}

Work MpiBackend::all_gather_in_place(at::Tensor& buffer, const std::string& label) {
  check_contiguous(buffer, "all_gather");
  if (buffer.numel() % size_ != 0)
    throw Error("MPI backend: all_gather needs a buffer of size() equal slices");
  at::Tensor host = host_buffer(buffer, /*copy_in=*/true);
  MPI_Request request = MPI_REQUEST_NULL;
  const int slice = mpi_count(buffer.numel() / size_, "all_gather");
  MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host.data_ptr(), slice,
                           mpi_datatype(host), comm_, &request));
  return make_work(request, watchdog(), "all_gather", label, bytes_of(buffer),
                   copy_back(buffer, host));
}

std::unique_ptr<CommBackend> make_mpi_backend(MPI_Comm comm) {
  return std::make_unique<MpiBackend>(comm);
}

// Host values travel over MPI whatever the tensor backend, non-blocking so that the watchdog can
// name a stalled collective.
double Communicator::all_reduce_scalar(double value, ReduceOp op, const std::string& label) {
  double result = value;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(&value, &result, 1, MPI_DOUBLE, mpi_op(op), comm_, &request));
  make_work(request, watchdog_, "all_reduce", label, sizeof(double)).wait();
  return result;
}

int64_t Communicator::all_reduce_count(int64_t value, ReduceOp op, const std::string& label) {
  int64_t result = value;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(&value, &result, 1, MPI_INT64_T, mpi_op(op), comm_, &request));
  make_work(request, watchdog_, "all_reduce", label, sizeof(int64_t)).wait();
  return result;
}

namespace {

Work all_reduce_host_doubles(std::vector<double>& values, ReduceOp op, MPI_Comm comm,
                             const std::shared_ptr<CommWatchdog>& watchdog,
                             const std::string& label) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values.data(),
                           mpi_count(static_cast<int64_t>(values.size()), "all_reduce"),
                           MPI_DOUBLE, mpi_op(op), comm, &request));
  return make_work(request, watchdog, "all_reduce", label,
                   static_cast<int64_t>(values.size() * sizeof(double)));
}

}  // namespace

void Communicator::all_reduce_doubles(std::vector<double>& values, ReduceOp op,
                                      const std::string& label) {
  all_reduce_host_doubles(values, op, comm_, watchdog_, label).wait();
}

Work Communicator::start_all_reduce_doubles(std::vector<double>& values, ReduceOp op,
                                            const std::string& label) {
  Work work = all_reduce_host_doubles(values, op, comm_, nullptr, label);
  work.test();  // MPI progresses a collective inside its calls: a first step now
  return work;
}

std::vector<int64_t> Communicator::gather_count(int64_t value, int root, const std::string& label) {
  std::vector<int64_t> values(rank_ == root ? size_ : 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Igather(&value, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T, root, comm_,
                        &request));
  make_work(request, watchdog_, "gather", label, sizeof(int64_t)).wait();
  return values;
}

void Communicator::broadcast_ints(std::vector<int>& values, int root, const std::string& label) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(values.data(), mpi_count(static_cast<int64_t>(values.size()), "broadcast"),
                       MPI_INT, root, comm_, &request));
  make_work(request, watchdog_, "broadcast", label,
            static_cast<int64_t>(values.size() * sizeof(int))).wait();
}

// The length first, so that every rank can make room for the characters.
std::string Communicator::broadcast_string(const std::string& value, int root,
                                           const std::string& label) {
  int64_t length = static_cast<int64_t>(value.size());
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(&length, 1, MPI_INT64_T, root, comm_, &request));
  make_work(request, watchdog_, "broadcast", label, sizeof(int64_t)).wait();
  std::string result = rank_ == root ? value : std::string(static_cast<size_t>(length), '\0');
  MPI_CHECK(MPI_Ibcast(result.data(), mpi_count(length, "broadcast"), MPI_CHAR, root, comm_,
                       &request));
  make_work(request, watchdog_, "broadcast", label, length).wait();
  return result;
}

void Communicator::all_to_all_bytes(const uint8_t* send, const std::vector<int64_t>& send_bytes,
                                    uint8_t* recv, const std::vector<int64_t>& recv_bytes,
                                    const std::string& label) {
  if (static_cast<int>(send_bytes.size()) != size_ || static_cast<int>(recv_bytes.size()) != size_)
    throw Error("all_to_all_bytes: " + std::to_string(send_bytes.size()) + " send and " +
                std::to_string(recv_bytes.size()) + " receive counts for " +
                std::to_string(size_) + " ranks");
  std::vector<int> send_counts(size_), send_displacements(size_), recv_counts(size_),
      recv_displacements(size_);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    send_counts[r] = mpi_count(send_bytes[r], "all_to_all");
    send_displacements[r] = mpi_count(sent, "all_to_all");
    sent += send_bytes[r];
    recv_counts[r] = mpi_count(recv_bytes[r], "all_to_all");
    recv_displacements[r] = mpi_count(received, "all_to_all");
    received += recv_bytes[r];
  }
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ialltoallv(send, send_counts.data(), send_displacements.data(), MPI_BYTE, recv,
                           recv_counts.data(), recv_displacements.data(), MPI_BYTE, comm_,
                           &request));
  make_work(request, watchdog_, "all_to_all", label, sent).wait();
}

}  // namespace hpc_train
