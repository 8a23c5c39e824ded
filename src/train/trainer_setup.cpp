// The trainer's start-up (Trainer's and Trainer::Impl's constructors): the phases that build what
// run() uses.
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <future>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/model/batch_norm_act.h"
#include "hpc_train/model/initial_weights.h"
#include "hpc_train/model/pool_bias_relu.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/runtime/startup_phases.h"
#include "hpc_train/runtime/test_hooks.h"
#include "hpc_train/train/run_options.h"
#include "trainer_impl.h"

namespace hpc_train {

namespace {

// The calling thread's current stream on `device`.
c10::Stream current_stream(const torch::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

Trainer::Impl::Impl(const TrainConfig& c, const DatasetFile& d, MPI_Comm mpi_comm,
                    const TrainerOutput& output, Placement where, StartupPhases* startup)
    : config(c), dataset(d), comm(mpi_comm, where.backend, where.cuda_device),
      reporter(output, comm.rank()), placement(where),
      device(where.cuda ? torch::Device(torch::kCUDA,
                                        static_cast<c10::DeviceIndex>(where.cuda_device))
                        : torch::Device(torch::kCPU)),
      dtype(model_dtype(c)),
      gpu_monitor(where.cuda ? where.cuda_device : -1),
      training_stream(where.cuda),
      sample_trace(comm.rank()) {
  // Note [Start-up phases]: each mark ends the phase since the previous one.
  const auto phase_ends = [startup](const char* name) {
    if (startup) startup->end_phase(name);
  };
  phase_ends("communicator");  // NCCL's, with the CUDA context it makes; the training stream
  comm.set_timeout(config.comm_timeout_s);
  const DatasetInfo& info = dataset.info();
  // Note [Resident upload beside the model]: the resident splits are read and copied to the
  // device on a thread of their own while the model and the optimizer are built (the upload,
  // a visible part of Fashion-MNIST's start-up, had come after them: bench/results-notes.md,
  // Note [Resident upload beside the model]); the data phase waits for it.
  train_input.emplace(info, device, dtype, default_augmentation(info, config.augment),
                      config.seed, comm.rank(), config.micro_batch);
  channels_last = placement.cuda && config.channels_last;
  evaluator.emplace(dataset, Split::kTest, device, dtype, channels_last, config.seed,
                    evaluation_batch(config, info, comm.size(), placement.cuda),
                    config.prefetch_batches, comm);
  const std::optional<GpuMemory> gpu = gpu_memory(placement);
  train_split_resident = keep_train_split_resident(config, info, gpu);
  std::future<void> resident_upload;
  if (train_split_resident) {
    const bool test_split_resident = keep_test_split_resident(config, info, gpu);
    resident_upload = std::async(std::launch::async, [this, test_split_resident] {
      const c10::DeviceGuard on_device(device);  // the thread's own current device
      if (test_fault("resident-upload", comm.rank()))  // Note [Test hooks]
        throw Error("test fault: the upload of the resident train split failed");
      train_input->keep_split_resident(dataset, Split::kTrain);
      if (test_split_resident) evaluator->keep_split_resident();
    });
  }
  const ModelShape shape{info.channels, info.height, info.width, info.num_classes};
  // Process-wide switches, set before the twin's thread below reads them.
  set_fused_batch_norm(config.fused_batch_norm);  // Note [Fused batch norm]
  set_fused_pooling(config.fused_pooling);        // Note [Fused pooling]
  // Written only where it changes: the early CUDA start's thread may still run a convolution,
  // which reads it (Note [Early CUDA start] set it from the same command line).
  if (placement.cuda && at::globalContext().deterministicCuDNN() != config.deterministic)
    at::globalContext().setDeterministicCuDNN(config.deterministic);
  // Note [Training step warm-up]: built before the run's seed, whose draws it leaves alone.
  std::unique_ptr<TrainableModel> twin;
  if (placement.cuda) twin = load_model(config.model, shape);
  torch::manual_seed(config.seed);
  model = load_model(config.model, shape);
  // --init-weights on every rank, before the broadcast, which then only confirms what every
  // rank read.
  if (!config.init_weights.empty()) {
    const std::string init_weights = test_fault("init-weights", comm.rank())  // Note [Test hooks]
                                         ? config.init_weights + ".missing-on-this-rank"
                                         : config.init_weights;
    const WeightsMatch match = load_initial_weights(
        init_weights, config.init_weights_partial, *model, config.model);
    reporter.say("%s\n", describe_weights_loaded(match, config.init_weights).c_str());
  }
  model->to(device, dtype);
  std::future<void> step_warm_up;
  if (twin)
    step_warm_up = std::async(std::launch::async, [&, twin = std::move(twin),
                                                   stream = current_stream(device)] {
      warm_up_training_step(*twin, device, dtype, channels_last, shape, config.micro_batch,
                            stream);
    });
  if (placement.cuda) {
    // At the evaluation's shape, with its sums (Note [One evaluation shape] in evaluation.h).
    evaluator->warm_up(check_runs_in(*model, evaluator->sample_input(),
                                     to_string(config.precision), config.model));
  } else if (dtype != torch::kFloat) {  // on the CPU shapes cost nothing ahead: one sample
    check_runs_in(*model,
                  torch::zeros({1, info.channels, info.height, info.width},
                               torch::TensorOptions().dtype(dtype)),
                  to_string(config.precision), config.model);
  }
  if (step_warm_up.valid()) step_warm_up.get();
  phase_ends("model");  // with the GPU's first uses (check_runs_in, the twin's step)
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  for (const auto& item : model->named_parameters()) {
    names.push_back(item.name);
    parameters.push_back(item.tensor);
  }
  int64_t parameter_count = 0;
  for (const at::Tensor& parameter : parameters) parameter_count += parameter.numel();
  const ReducerOptions bucketing = reducer_options(config, comm.size(), parameter_count);
  BucketLayout layout = Reducer::initial_layout(parameters, bucketing, comm.size());
  // Note [Channels-last weights]
  flat = FlatParameters(std::move(names), std::move(parameters), std::move(layout),
                        /*channels_last_weights=*/channels_last);
  if (test_fault("alloc", comm.rank()))  // Note [Test hooks]: more bytes than any node has
    torch::empty({int64_t{1} << 58}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  // Every rank starts from rank 0's parameters and buffers.
  comm.broadcast(flat.values(), 0).wait();
  broadcast_buffers(*model, comm);
  reducer.emplace(flat, comm, bucketing);
  optimizer.emplace(flat, *reducer, comm, zero_options(config));
  checkpoints.emplace(config, info, comm, *model, flat.numel(), device, *optimizer, reporter);
  phase_ends("optimizer");  // flat storage, the broadcast, buckets, the optimizer's state
  if (config.data_store == DataStore::kMemory) {  // Note [Read-once sample store]
    store.emplace(dataset, comm, store_limit_bytes(config.data_store_limit_mb, comm.mpi_comm()));
    reporter.say("Data store: rank 0 read %s\n", store->describe_read().c_str());
  }
  if (resident_upload.valid()) resident_upload.get();  // rethrows the thread's error
  phase_ends("data");  // the store's read, what is left of the resident splits' upload
  step.emplace(*model, *reducer, *optimizer, comm.size(), config, channels_last, placement.cuda,
               device);
  graphed_step.emplace(capture_steps(config, placement), config.cuda_graph == Switch::kOn);
  resumed_from = checkpoints->to_resume();
  if (!resumed_from.empty()) start = checkpoints->resume(resumed_from);
  checkpoints->start_branch(resumed_from, start.global_step);
  phase_ends("resume");
}

MemoryBytes Trainer::Impl::memory() const {
  MemoryBytes bytes;
  bytes.parameters = flat.values().numel() * flat.values().element_size();
  bytes.gradients = reducer->gradient_bytes();
  bytes.optimizer_state = optimizer->state_bytes();
  return bytes;
}

// The losses summed since the last call and how many micro-steps they are; starts a new sum
// (waits for the device).

Trainer::Trainer(const TrainConfig& config, const DatasetFile& dataset, MPI_Comm comm,
                 const TrainerOutput& output, Placement placement, StartupPhases* startup)
    : impl_(without_libtorch_backtrace([&] {
        return std::make_unique<Impl>(config, dataset, comm, output, placement, startup);
      })) {}

Trainer::~Trainer() = default;

}  // namespace hpc_train
