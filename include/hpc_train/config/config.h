// The run's configuration: one plain struct with every default in one place, read from the
// command line and an INI file (Boost.ProgramOptions; the command line wins), validated with
// messages that say what to change, and written back as INI (the resolved configuration that
// rank 0 prints and stores in the run directory, readable again with --config).
//
// Defaults are the origin recipe: simple_cnn, micro-batch 64 per rank, 10 epochs,
// AdamW(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), seed 42.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hpc_train/config/config_choices.h"

namespace hpc_train {

inline constexpr const char* kDefaultDatasetPath = "data/fashion-mnist.h5";

struct TrainConfig {
  // [data]
  std::string dataset_path = kDefaultDatasetPath;  // --dataset
  bool drop_last = false;      // --drop-last: drop the epoch's tail instead of padding it
  int prefetch_batches = 4;    // --prefetch: batches read ahead by the loader thread
  int reader_threads = 8;      // --reader-threads: a batch's reads in flight (reader_threads.h)
  Switch augment = Switch::kAuto;  // --augment auto|on|off: random crop + flip (auto: CIFAR-like)
  Switch resident_data = Switch::kAuto;  // --resident-data auto|on|off: splits on the device
  DataStore data_store = DataStore::kFile;  // --data-store file|memory (sample_store.h)
  // --data-store-limit-mb: host memory (MiB) a rank's share of a memory store may take;
  // 0 = the node's MemAvailable divided by its ranks
  int64_t data_store_limit_mb = 0;

  // [model]
  // --model: a name from the model registry, or a TorchScript file (a path ending in .pt or
  // .pth, or holding a '/'; models.h names_torchscript_file)
  std::string model = "simple_cnn";
  std::string init_weights;           // --init-weights FILE.safetensors: start from these weights
  bool init_weights_partial = false;  // --init-weights-partial: load what fits, list the rest

  // [training]
  int epochs = 10;                // --epochs
  int64_t max_steps = 0;          // --max-steps: stop after this many optimizer steps; 0 = no limit
  int micro_batch = 64;           // --micro-batch: samples per rank per step
  int eval_batch = 0;             // --eval-batch: samples per rank per evaluation batch; 0 = auto
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // --optimizer adamw|adam|sgd|lamb|lars
  double lr = 1e-3;               // --lr
  double beta1 = 0.9;             // --beta1
  double beta2 = 0.999;           // --beta2
  double eps = 1e-8;              // --eps
  // --weight-decay: decoupled for adamw and lamb, L2 for adam, sgd and lars
  double weight_decay = 0.01;
  bool no_decay_bias_bn = false;  // --no-decay-bias-bn: none on parameters below 2-D
  double label_smoothing = 0.0;   // --label-smoothing: the training loss's (torch's meaning)
  double ema_decay = 0.0;         // --ema-decay: keep an EMA of the weights; 0 = none
  double momentum = 0.0;          // --momentum: SGD's and LARS's; 0 = no momentum buffer
  double dampening = 0.0;         // --dampening: SGD's and LARS's
  bool nesterov = false;          // --nesterov: SGD's or LARS's momentum as Nesterov's
  // The layer-wise trust ratios (Note [Trust ratios] in optimizer.h)
  double trust_coefficient = 1e-3;  // --trust-coefficient: LARS's eta
  double min_trust_ratio = 0.0;   // --min-trust-ratio: LAMB's lower bound (DeepSpeed's min_coeff)
  double max_trust_ratio = 0.0;   // --max-trust-ratio: LAMB's upper bound; 0 = none (max_coeff)
  // --lamb-bias-correction moments|step|none: where LAMB corrects the moments' bias
  LambBiasCorrection lamb_bias_correction = LambBiasCorrection::kMoments;
  uint64_t seed = 42;             // --seed: parameters' initialisation and the epoch plan
  int grad_accum = 1;             // --grad-accum: micro-steps per optimizer step
  double clip_grad = 0.0;         // --clip-grad: max global gradient norm; 0 = no clipping
  // --lr-schedule constant|warmup|warmup-cosine|warmup-decay|one-cycle|multistep
  LrScheduleKind lr_schedule = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;       // --warmup-steps: optimizer steps of warm-up
  WarmupType warmup_type = WarmupType::kLinear;  // --warmup-type linear|log (DeepSpeed's: log)
  double warmup_start_ratio = 0.0;  // --warmup-start-ratio: lr at step 0, as a fraction of --lr
  double cosine_final_ratio = 0.0;  // --cosine-final-ratio: lr at the end, as a fraction of --lr
  int64_t schedule_steps = 0;     // --schedule-steps: the cosine's or decay's end; 0 = the run's
  // one-cycle (DeepSpeed's OneCycle; --lr is the cycle's peak)
  double cycle_min_ratio = 0.1;   // --cycle-min-ratio: the cycle's lowest lr, a fraction of --lr
  int64_t cycle_first_steps = 0;  // --cycle-first-steps: steps up; 0 = half the run
  int64_t cycle_second_steps = 0; // --cycle-second-steps: steps down; 0 = as many as up
  int64_t cycle_decay_steps = 0;  // --cycle-decay-steps: DeepSpeed's decay_step_size; 0 = none
  double cycle_decay_lr_rate = 0.0;        // --cycle-decay-lr-rate
  double cycle_decay_momentum_rate = 0.0;  // --cycle-decay-momentum-rate
  bool cycle_momentum = true;     // --cycle-momentum: cycle the momentum (sgd, lars) or beta1
  double cycle_min_momentum = 0.8;  // --cycle-min-momentum
  double cycle_max_momentum = 0.9;  // --cycle-max-momentum
  // multistep (torch's MultiStepLR)
  std::string lr_milestones;      // --lr-milestones: optimizer steps, comma-separated, ascending
  // --lr-milestone-epochs: the same in epochs, as torchvision's --lr-steps (the step that ends
  // each such epoch); one of the two with multistep
  std::string lr_milestone_epochs;
  double lr_gamma = 0.1;          // --lr-gamma: the lr's factor at each milestone

  // [zero] ZeRO partitioning and mixed precision
  int zero_stage = 0;             // --zero-stage 0|1|2
  Precision precision = Precision::kFp32;  // --precision fp32|fp16|bf16
  // --grad-accum-dtype model|fp32: what fp16/bf16 gradients add up in across the micro-steps of
  // --grad-accum (Note [Gradient precision] in flat_parameters.h)
  GradientDtype grad_accum_dtype = GradientDtype::kModel;
  double loss_scale = 0.0;        // --loss-scale: fixed fp16 loss scale; 0 = dynamic
  int initial_scale_power = 16;   // --initial-scale-power: dynamic scale starts at 2^this
  int loss_scale_window = 1000;   // --loss-scale-window: steps without overflow before doubling
  int hysteresis = 2;             // --hysteresis: overflows tolerated before halving
  double min_loss_scale = 1.0;    // --min-loss-scale: overflow at this scale is an error

  // [comm] gradient reduction
  // --bucket-mb: gradient bucket size, MiB; 0: chosen by the ZeRO stage and world size
  // (bucket_mib in run_options.h, Note [Bucket size at ZeRO-2])
  double bucket_mb = 0.0;
  double first_bucket_mb = 1.0;   // --first-bucket-mb: the first (last-layer) bucket, MiB, as DDP
  bool overlap_comm = true;       // --overlap-comm: start a bucket's collective during backward
  // --comm-dtype model|fp32: what fp16/bf16 gradients are summed in across ranks (the gradient
  // all-reduce or reduce-scatter), and what the optimizer reads
  GradientDtype comm_dtype = GradientDtype::kModel;

  // [runtime]
  DeviceChoice device = DeviceChoice::kAuto;    // --device auto|cuda|cpu
  BackendChoice backend = BackendChoice::kAuto;  // --backend auto|nccl|mpi|none
  int threads_per_rank = 0;       // --threads-per-rank: LibTorch threads; 0 = the node's cores / ranks
  double comm_timeout_s = 300.0;  // --comm-timeout: a collective unfinished after this ends the job; 0 = never
  // --cuda-graph auto|on|off: replay each GPU step as one CUDA graph (step_graph.h); auto falls
  // back to eager steps where the step cannot be captured (MPI backend, gradient accumulation).
  Switch cuda_graph = Switch::kAuto;
  bool channels_last = true;      // --channels-last: NHWC inputs and conv weights on the GPU
  bool cudnn_benchmark = false;   // --cudnn-benchmark: time cuDNN's convolution algorithms, keep the fastest
  // --fused-batch-norm: the zoo's ResNets' batch norms, with their ReLU and residual add, as the
  // fused kernels of ours in training on a GPU (batch_norm_act.h); off: LibTorch's ops
  bool fused_batch_norm = true;
  // --fused-pooling: simple_cnn's max pooling, bias and ReLU as one kernel of ours on a GPU
  // (pool_bias_relu.h); off: LibTorch's ops
  bool fused_pooling = true;
  // --deterministic: GPU runs repeat bit for bit (deterministic cuDNN algorithms, no autotuning);
  // off, cuDNN may pick algorithms that sum in a varying order (faster, not reproducible)
  bool deterministic = false;
  // --cuda-profiler-start-step N, --cuda-profiler-steps K: steps N .. N+K-1 run between
  // cudaProfilerStart and cudaProfilerStop (cuda_profiler.h); 0 = never
  int64_t cuda_profiler_start_step = 0;
  int64_t cuda_profiler_steps = 1;

  // [checkpoint]
  int64_t checkpoint_every = 0;   // --checkpoint-every: steps between checkpoints; 0 = off
  // --checkpoint-every-minutes: wall-clock minutes between checkpoints, rank 0's clock since the
  // last checkpoint written or the run's start (Note [Checkpoint clock] in
  // checkpoint_cadence.h); 0 = off. With --checkpoint-every, whichever rule is due writes one.
  double checkpoint_every_minutes = 0.0;
  bool checkpoint_epochs = true;  // --checkpoint-epochs: also write one at every epoch end
  int keep_checkpoints = 3;       // --keep-checkpoints: newest kept; 0 = keep all
  std::string resume;             // --resume auto|FILE: auto = newest in the run dir, if any; empty = fresh start
  std::string export_weights;     // --export-weights FILE.safetensors at the end of the run

  // [output]
  std::string run_dir;            // --run-dir; empty = runs/<UTC timestamp>, chosen by rank 0
  int log_every = 50;             // --log-every: steps between log lines and metrics records
  // --progress auto|bar|lines: auto draws a bar when stdout is a terminal
  ProgressStyle progress = ProgressStyle::kAuto;
  // Monitors (DeepSpeed's tensorboard and csv_monitor blocks): rank 0 writes each log interval's
  // and epoch's scalars to <output path>/<job name>/, the output path being the run directory
  // when empty (monitor_directory()).
  bool tensorboard = true;                       // --tensorboard on|off: TensorBoard event files
  std::string tensorboard_output_path;           // --tensorboard-output-path; empty = the run dir
  std::string tensorboard_job_name = "tensorboard";  // --tensorboard-job-name
  bool csv_monitor = false;                      // --csv-monitor on|off: one CSV file per scalar
  std::string csv_monitor_output_path;           // --csv-monitor-output-path; empty = the run dir
  std::string csv_monitor_job_name = "csv_monitor";  // --csv-monitor-job-name
};

// DeepSpeed's ds_config.json, mapped onto TrainConfig (deepspeed_config.h); --deepspeed-config.
struct DeepSpeedImport {
  std::string path;                 // --deepspeed-config FILE; empty = none
  bool allow_unknown_keys = false;  // --deepspeed-allow-unknown: warn instead of failing
};

// What the command line asked for.
struct CommandLine {
  // kPrintAndExit: print `text` (--help) on rank 0; kPrintBuild: --version, the build report.
  enum class Action { kTrain, kPrintAndExit, kPrintBuild };
  Action action = Action::kTrain;
  std::string text;  // for kPrintAndExit: the --help text
  TrainConfig config;
  std::string config_file;  // --config FILE, empty when none
  DeepSpeedImport deepspeed;
  // Long names of the options given on the command line itself (e.g. "micro-batch"): a
  // DeepSpeed config does not override them.
  std::set<std::string> given_on_command_line;
};

// Parses argv (and the --config file it names). Pure: no MPI, no output. Throws ConfigError for
// unknown options, malformed values, unreadable or unknown keys in the INI file.
CommandLine parse_command_line(int argc, const char* const argv[]);

// Checks values that parse but cannot work (micro_batch 0, lr < 0, a cosine shorter than its
// warm-up, ...); a choice's name was checked when it was read (config_choices.h).
// Throws ConfigError that names the option and says what would work. The model name is checked
// by the model registry, and what depends on the world size or the dataset by
// validate_for_dataset.
void validate(const TrainConfig& config);

// --lr-milestones' optimizer steps, ascending; empty for ''. Throws ConfigError for anything else.
std::vector<int64_t> lr_milestone_steps(const std::string& text);
// --lr-milestone-epochs' epochs, the same way.
std::vector<int64_t> lr_milestone_epochs(const std::string& text);

struct DatasetInfo;  // dataset_file.h

// Checks what depends on the opened dataset and the world size, before anything is allocated
// for training: --micro-batch against each rank's share of the train split (Note [Rank's share
// of the train split] in config.cpp), and the host memory that the input needs at the least
// against `host_memory_bytes` (Note [Input memory bound]); `input_on_host`: the run computes on
// the CPU, so a resident train split would live in host memory. Throws ConfigError naming the
// option, or DataError naming the file when even one sample does not fit.
void validate_for_dataset(const TrainConfig& config, const DatasetInfo& dataset,
                          const std::string& dataset_path, int world_size,
                          int64_t host_memory_bytes, bool input_on_host);

// Whether --resume asks for the run directory's newest checkpoint ("auto"), rather than naming
// a file (or being empty: a fresh start). --resume stays text, since it is mostly a path.
bool resumes_newest_checkpoint(const TrainConfig& config);

// Where a monitor writes: <output_path>/<job_name>, with `run_dir` for an empty output path
// (DeepSpeed's layout; its empty output path means the launch directory).
std::string monitor_directory(const std::string& output_path, const std::string& job_name,
                              const std::string& run_dir);

// The configuration as INI text, grouped by section, every option with its value; reading it
// back with --config gives the same configuration.
std::string to_ini(const TrainConfig& config);

}  // namespace hpc_train
