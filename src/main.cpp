// hpc_train: data-parallel training, one MPI rank per GPU (or 3 ranks on a CPU-only machine).
//
// Reads as a table of contents:
//   binding  -> Open MPI's default one-core binding undone           (cpu_binding.h)
//   config   -> the command line, INI file and DeepSpeed config       (config.h, deepspeed_config.h)
//   runtime  -> MPI, ranks, threads, how errors end the job          (runtime.h)
//   build    -> what this binary was built with (--version, the log header, summary.json)
//                                                                    (build_info.h)
//   placement -> every rank's device and backend, agreed by all     (placement.h)
//   run dir  -> config.ini, metrics.jsonl, summary.json, monitors   (run_dir.h)
//   data     -> the HDF5 dataset, opened and validated on every rank (dataset_file.h), and the
//               configuration checked against it                     (config.h)
//   trainer  -> model, epochs, steps, evaluation                     (trainer.h)
//   summary  -> printed by rank 0 and written to summary.json
// `hpc_train evaluate ...` evaluates trained weights instead          (evaluate_command.h)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hpc_train/config/config.h"
#include "hpc_train/config/evaluate_config.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/config/deepspeed_config.h"
#include "hpc_train/io/atomic_file.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/build_info.h"
#include "hpc_train/runtime/cpu_binding.h"
#include "hpc_train/runtime/placement.h"
#include "hpc_train/runtime/run_dir.h"
#include "hpc_train/runtime/runtime.h"
#include "hpc_train/runtime/startup_phases.h"
#include "hpc_train/runtime/stop_signal.h"
#include "hpc_train/train/evaluate_command.h"
#include "hpc_train/train/run_options.h"
#include "hpc_train/train/trainer.h"

using namespace hpc_train;

namespace {

// The command line as parsed before MPI starts; nullopt when it does not parse, which is left
// to the agreed phase in main, which reports it from every rank.
std::optional<CommandLine> parse_before_mpi(int argc, char** argv) {
  try {
    return parse_command_line(argc, argv);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// --help and --version answer without starting MPI: started alone, Open MPI's singleton start
// spawns a daemon through ssh/rsh, which a login node, a container or a GPU box may not have,
// and asking what a binary is must not depend on that. Under a launcher only rank 0 prints.
// Returns the exit code when the command line asked for one of them.
std::optional<int> answer_without_mpi(const std::optional<CommandLine>& command_line) {
  if (!command_line || command_line->action == CommandLine::Action::kTrain) return std::nullopt;
  if (launcher_rank() != 0) return kExitOk;
  std::printf("%s", command_line->action == CommandLine::Action::kPrintAndExit
                        ? command_line->text.c_str()
                        : format_build_report(build_report()).c_str());
  return kExitOk;
}

// The whole run; MPI is finalized when it returns (Runtime's destructor).
int run(int argc, char** argv) {
  StartupPhases startup;  // Note [Start-up phases]
  const std::optional<CommandLine> before_mpi = parse_before_mpi(argc, argv);
  if (const std::optional<int> exit_code = answer_without_mpi(before_mpi)) return *exit_code;
  // Before the first thread of ours, which would keep the binding (Note [Open MPI's default core
  // binding]).
  const std::string cpu_binding = undo_default_core_binding();
  // Note [Early CUDA start]: the context and cuBLAS/cuDNN start while MPI does.
  EarlyCudaStart early_cuda(before_mpi ? &before_mpi->config : nullptr,
                            before_mpi ? model_dtype(before_mpi->config) : torch::kFloat);
  Runtime runtime(&argc, &argv, launcher_one_node());  // Note [Single-node MPI transport]
  startup.end_phase("mpi");
  // Before anything slow: a preemption signal during start-up must not kill the process.
  install_stop_signal_handlers();
  return run_or_abort(runtime, [&] {
    CommandLine command_line;
    std::vector<std::string> warnings;
    run_agreed_phase(runtime, [&] {
      // Parsed once, before MPI (--help and --version were answered there); a command line
      // that did not parse is parsed again here, so that every rank reports its error.
      command_line = before_mpi ? *before_mpi : parse_command_line(argc, argv);
      // A DeepSpeed config's batch identity depends on the world size.
      warnings = apply_deepspeed_config(command_line.deepspeed, runtime.world_size(),
                                        command_line.given_on_command_line, command_line.config);
      validate(command_line.config);
    });
    const std::vector<BuildItem> build = build_report();
    if (runtime.rank() == 0)
      for (const std::string& warning : warnings) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    TrainConfig& config = command_line.config;
    config.run_dir = create_run_directory(runtime, config.run_dir);
    startup.end_phase("config");
    int threads = 0;  // nodes may differ: every rank checks its own
    run_agreed_phase(runtime, [&] {
      threads = compute_threads_per_rank(runtime.local_size(), config.threads_per_rank);
    });
    set_compute_threads(threads);
    const Placement placement = agree_placement(runtime, config);
    startup.end_phase("placement");  // devices probed and agreed (CUDA starts in the trainer)
    if (runtime.rank() == 0) {
      const std::string resolved = to_ini(config);
      write_file_atomically(config.run_dir + "/config.ini", resolved);
      std::printf("hpc_train %s: %d rank(s); rank 0 on %s; %d CPU thread(s) per rank\n"
                  "Nodes: %s\n%s%s\n",
                  HPC_TRAIN_VERSION, runtime.world_size(), placement.describe().c_str(), threads,
                  placement.ranks_by_node.c_str(), format_build_report(build).c_str(),
                  resolved.c_str());
      if (!cpu_binding.empty()) std::printf("%s\n", cpu_binding.c_str());
      std::fflush(stdout);
    }

    std::optional<DatasetFile> dataset;
    run_agreed_phase(runtime, [&] {
      dataset.emplace(DatasetFile::open(config.dataset_path,
                                        preferred_file_access(runtime.thread_multiple()),
                                        runtime.world(), config.reader_threads));
      validate_for_dataset(config, dataset->info(), config.dataset_path, runtime.world_size(),
                           physical_memory_bytes(), !placement.cuda);
    });
    startup.end_phase("dataset");

    TrainerOutput output;
    output.run_dir = config.run_dir;
    if (config.tensorboard) {
      output.tensorboard_dir = monitor_directory(config.tensorboard_output_path,
                                                 config.tensorboard_job_name, config.run_dir);
      create_output_directory(runtime, output.tensorboard_dir,
                              "--tensorboard-output-path/--tensorboard-job-name");
    }
    if (config.csv_monitor) {
      output.csv_monitor_dir = monitor_directory(config.csv_monitor_output_path,
                                                 config.csv_monitor_job_name, config.run_dir);
      create_output_directory(runtime, output.csv_monitor_dir,
                              "--csv-monitor-output-path/--csv-monitor-job-name");
    }
    output.progress_bar =
        config.progress == ProgressStyle::kBar ||
        (config.progress == ProgressStyle::kAuto && stdout_is_terminal());
    // Not an agreed phase (Note [Ending the job] in runtime.h): the trainer's construction runs
    // collectives (the communicator's start, the broadcast of the weights, the resumed
    // checkpoint's), and a rank failing before one of them must not wait in the agreement while
    // the others wait in the collective. Its error reaches run_or_abort: that rank prints it at
    // once and the job ends.
    const auto trainer = std::make_unique<Trainer>(config, *dataset, runtime.world(), output,
                                                   placement, &startup);
    // Only now (Note [Early CUDA start]): the thread's loads ran beside the trainer's.
    const std::string early_cuda_warning = early_cuda.finish(placement);
    if (!early_cuda_warning.empty())
      std::fprintf(stderr, "warning: rank %d: %s\n", runtime.rank(), early_cuda_warning.c_str());
    if (runtime.rank() == 0) {
      std::printf("%s (rank 0)\n", startup.describe().c_str());
      std::fflush(stdout);
    }

    const TrainSummary summary = trainer->run();
    if (summary.stop_signal != 0) {
      if (runtime.rank() == 0)
        std::printf("Stopped by %s after step %lld with checkpoint %s; continue with --run-dir %s "
                    "--resume auto (exit code %d)\n",
                    stop_signal_name(summary.stop_signal), static_cast<long long>(summary.steps),
                    summary.last_checkpoint.c_str(), config.run_dir.c_str(), kExitPreempted);
      std::fflush(stdout);
      // Every rank has the checkpoint on disk: they all return the same code.
      return kExitPreempted;
    }

    if (runtime.rank() == 0) {
      nlohmann::json record = summary.to_json();
      record["dataset"] = config.dataset_path;
      record["micro_batch"] = config.micro_batch;
      record["threads_per_rank"] = threads;
      record["run_dir"] = config.run_dir;
      record["build"] = build_report_json(build);
      record["startup"] = startup.to_json();
      write_file_atomically(config.run_dir + "/summary.json", record.dump(2) + "\n");
      std::printf("Finished: %d epoch(s), %lld steps in %.1f s (warm-up %.2f s), %.1f samples/s, "
                  "%.2f ms/step; test loss %.4f, test accuracy %.2f%%\nRun directory: %s\n",
                  summary.epochs_completed, static_cast<long long>(summary.steps),
                  summary.wall_s, summary.warmup_s, summary.samples_per_s, summary.ms_per_step,
                  summary.test.loss,
                  100.0 * summary.test.accuracy, config.run_dir.c_str());
    }
    return kExitOk;
  });
}

}  // namespace

// Note [Quick exit]: when run() returns, the run's files are written and closed, the
// communicators destroyed, the threads joined and MPI finalized. What exit() would still do is
// the libraries' static teardown, which mpirun (and so the job) waits for: LibTorch's alone
// deregisters every operator kernel from its dispatcher, a good part of the time between
// MPI_Finalize and the process's end, itself a visible part of a short job
// (bench/results-notes.md, Note [Quick exit]). So main flushes stdio and ends the process with
// _Exit; the kernel releases the memory, the files and the GPU as at any exit. (A leak checker
// that reports at exit, such as LeakSanitizer, reports nothing for hpc_train.)
int main(int argc, char** argv) {
  const bool evaluate = argc > 1 && std::strcmp(argv[1], kEvaluateCommand) == 0;
  const int exit_code = evaluate ? run_evaluate_command(argc, argv) : run(argc, argv);
  std::fflush(nullptr);
  std::_Exit(exit_code);
}
