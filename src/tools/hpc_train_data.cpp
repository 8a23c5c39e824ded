// hpc_train_data: converts published datasets to the HDF5 layout hpc_train reads, describes
// such files, and exports a checkpoint's weights. A single-process tool (no MPI start-up), except
// convert imagefolder, which starts MPI (a Runtime) and decodes over the ranks of mpirun -np N.
//
//   hpc_train_data convert fashion-mnist|mnist|cifar10|cifar10-python SRC_DIR OUT.h5
//                          [--max-train N] [--max-test N]
//   hpc_train_data convert npz FILE.npz OUT.h5 [--layout nhwc|nchw] [--num-classes K]
//   [mpirun -np N] hpc_train_data convert imagefolder ROOT OUT.h5 --size HxW
//                          [--test-fraction F [--seed S]] [--skip-bad-images] [--rank-zero-writes]
//   hpc_train_data inspect FILE.h5
//   hpc_train_data shard IN.h5 --shards K OUT_PREFIX
//   hpc_train_data export CHECKPOINT.h5 OUT.safetensors
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "hpc_train/io/checkpoint.h"
#include "hpc_train/data/converters.h"
#include "hpc_train/data/dataset_file.h"
#include "hpc_train/data/image_folder.h"
#include "hpc_train/data/dataset_shards.h"
#include "hpc_train/error.h"
#include "hpc_train/runtime/runtime.h"

namespace po = boost::program_options;
using namespace hpc_train;

namespace {

const char* const kUsage =
    "usage:\n"
    "  hpc_train_data convert fashion-mnist|mnist|cifar10|cifar10-python SRC_DIR OUT.h5 "
    "[--max-train N] [--max-test N]\n"
    "  hpc_train_data convert npz FILE.npz OUT.h5 [--layout nhwc|nchw] [--num-classes K] "
    "[--max-train N] [--max-test N]\n"
    "  [mpirun -np N] hpc_train_data convert imagefolder ROOT OUT.h5 --size HxW "
    "[--test-fraction F [--seed S]] [--skip-bad-images] [--rank-zero-writes]\n"
    "  hpc_train_data inspect FILE.h5\n"
    "  hpc_train_data shard IN.h5 --shards K OUT_PREFIX\n"
    "  hpc_train_data export CHECKPOINT.h5 OUT.safetensors\n"
    "  hpc_train_data --help | --version\n"
    "\n"
    "convert reads the published files in SRC_DIR (IDX: train-images-idx3-ubyte,\n"
    "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, raw or .gz;\n"
    "CIFAR-10 binary: data_batch_1..5.bin, test_batch.bin; CIFAR-10 python:\n"
    "cifar-10-batches-py/ with data_batch_1..5, test_batch, batches.meta) or the numpy .npz\n"
    "file (x_train, y_train, x_test, y_test: uint8 images N,H,W,C (--layout nhwc, the\n"
    "default), N,C,H,W (nchw) or N,H,W; integer labels; classes = the largest label + 1\n"
    "unless --num-classes) and writes OUT.h5 (layout: data/README.md).\n"
    "convert imagefolder reads a torchvision ImageFolder tree of JPEG and PNG files:\n"
    "ROOT/train/<class>/ and ROOT/val/<class>/, or ROOT/<class>/ split by --test-fraction\n"
    "(per class, seeded by --seed); classes are the sorted folder names; every image becomes\n"
    "RGB, scaled (bilinear, as PIL) to cover HxW and centre-cropped. Under mpirun each rank\n"
    "decodes 1/N of the images and writes them into OUT.h5 (parallel HDF5), or rank 0\n"
    "gathers them and writes (serial HDF5, or --rank-zero-writes).\n"
    "inspect prints a summary of a dataset file. export writes the model\n"
    "weights of a checkpoint (RUN_DIR/checkpoints/step-*.h5) as safetensors, which\n"
    "safetensors.torch.load_file reads as a PyTorch state_dict.\n"
    "shard splits a dataset into K files OUT_PREFIX-0000i-of-0000K.h5 (each split cut into\n"
    "contiguous ranges, the source's mean/std kept) and the index OUT_PREFIX.shards;\n"
    "hpc_train --dataset and inspect take the index or a quoted pattern of the files.\n";

int convert(const std::vector<std::string>& args, const ConvertOptions& options,
            bool npz_options_given) {
  if (args.size() != 3)
    throw ConfigError("convert takes FORMAT SRC_DIR OUT.h5 (got " + std::to_string(args.size()) +
                      " arguments)");
  const SourceFormat format = parse_source_format(args[0]);
  if (npz_options_given && format != SourceFormat::kNpz)
    throw ConfigError("--layout and --num-classes belong to convert npz");
  DatasetContents contents = read_source_dataset(format, args[1], options);
  const DatasetInfo source = contents.info;
  const size_t train = contents.train_labels.size(), test = contents.test_labels.size();
  const std::string shape = std::to_string(source.channels) + "x" +
                            std::to_string(source.height) + "x" + std::to_string(source.width);
  write_dataset_file(args[2], std::move(contents));
  std::printf("wrote %s: %zu train, %zu test samples, %s, %lld classes\n", args[2].c_str(), train,
              test, shape.c_str(), static_cast<long long>(source.num_classes));
  return kExitOk;
}

// convert imagefolder: the one collective command (image_folder.h), so the only one that starts
// MPI. Errors after the start are reported once, by rank 0 (run_agreed_phase).
int convert_image_folder_command(const std::vector<std::string>& args,
                                 const ImageFolderOptions& options, int* argc, char*** argv) {
  const Runtime runtime(argc, argv);
  return run_or_abort(runtime, [&] {
    const ImageFolderSummary summary = convert_image_folder(runtime, args[1], args[2], options);
    if (runtime.rank() == 0) {
      std::printf("wrote %s: %lld train, %lld test samples, 3x%lldx%lld, %lld classes",
                  args[2].c_str(), static_cast<long long>(summary.train),
                  static_cast<long long>(summary.test), static_cast<long long>(options.height),
                  static_cast<long long>(options.width), static_cast<long long>(summary.classes));
      if (options.skip_bad_images)
        std::printf(", %lld bad images skipped", static_cast<long long>(summary.skipped));
      std::printf(" (decoded on %d rank%s)\n", runtime.world_size(),
                  runtime.world_size() == 1 ? "" : "s");
    }
    return kExitOk;
  });
}

int shard(const std::vector<std::string>& args, int64_t shards) {
  if (args.size() != 2)
    throw ConfigError("shard takes IN.h5 OUT_PREFIX and --shards K (got " +
                      std::to_string(args.size()) + " arguments)");
  const std::vector<std::string> written = write_dataset_shards(args[0], shards, args[1]);
  for (const std::string& path : written) std::printf("wrote %s\n", path.c_str());
  return kExitOk;
}

int export_weights(const std::vector<std::string>& args) {
  if (args.size() != 2)
    throw ConfigError("export takes CHECKPOINT.h5 OUT.safetensors (got " +
                      std::to_string(args.size()) + " arguments)");
  const Checkpoint checkpoint = read_checkpoint(args[0]);
  write_weights_safetensors(args[1], checkpoint);
  size_t bytes = 0;
  for (const CheckpointTensor& tensor : checkpoint.model_state) bytes += tensor.data.size();
  std::printf("wrote %s: %zu tensors, %zu bytes of weights, %s for %lldx%lldx%lld images and "
              "%lld classes, step %lld\n",
              args[1].c_str(), checkpoint.model_state.size(), bytes, checkpoint.model.c_str(),
              static_cast<long long>(checkpoint.channels),
              static_cast<long long>(checkpoint.height), static_cast<long long>(checkpoint.width),
              static_cast<long long>(checkpoint.num_classes),
              static_cast<long long>(checkpoint.position.global_step));
  return kExitOk;
}

int run(int argc, char** argv) {
  int64_t max_train = -1, max_test = -1, num_classes = -1, shards = 0;
  std::string layout = "nhwc";
  std::string image_size;
  double test_fraction = 0.0;
  uint64_t seed = 0;
  bool skip_bad_images = false;
  bool rank_zero_writes = false;
  po::options_description visible("options");
  visible.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("max-train", po::value<int64_t>(&max_train), "convert: keep only the first N train samples")
      ("max-test", po::value<int64_t>(&max_test), "convert: keep only the first N test samples")
      ("layout", po::value<std::string>(&layout),
       "convert npz: the axes of 4-D image arrays, nhwc (default) or nchw")
      ("num-classes", po::value<int64_t>(&num_classes),
       "convert npz: the number of classes (default: the largest label + 1)")
      ("size", po::value<std::string>(&image_size),
       "convert imagefolder: HxW of the stored images (required), e.g. 224x224")
      ("test-fraction", po::value<double>(&test_fraction),
       "convert imagefolder, one tree ROOT/<class>/: the share of each class to test on, [0, 1)")
      ("seed", po::value<uint64_t>(&seed),
       "convert imagefolder: the seed of the --test-fraction split (default 0)")
      ("skip-bad-images", po::bool_switch(&skip_bad_images),
       "convert imagefolder: report and skip files that do not decode (else exit 3)")
      ("rank-zero-writes", po::bool_switch(&rank_zero_writes),
       "convert imagefolder: rank 0 gathers the images and writes (the way of a serial HDF5), "
       "instead of every rank writing its own through MPI-IO")
      ("shards", po::value<int64_t>(&shards), "shard: the number of files to write");

  po::options_description hidden;
  hidden.add_options()
      ("command", po::value<std::string>())
      ("args", po::value<std::vector<std::string>>()->multitoken());
  po::options_description all;
  all.add(visible).add(hidden);
  po::positional_options_description positional;
  positional.add("command", 1).add("args", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(e.what());
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << visible;
    return kExitOk;
  }
  if (vm.count("version")) {
    std::printf("hpc_train_data %s\nimage decoding (convert imagefolder): %s\n", HPC_TRAIN_VERSION,
                image_decoder_libraries().c_str());
    return kExitOk;
  }
  if (!vm.count("command")) throw ConfigError("no command given (convert, inspect, shard or export)");
  const std::string command = vm["command"].as<std::string>();
  const std::vector<std::string> args =
      vm.count("args") ? vm["args"].as<std::vector<std::string>>() : std::vector<std::string>{};

  if (command != "shard" && vm.count("shards")) throw ConfigError("--shards belongs to shard");
  if (command == "convert") {
    for (const char* name : {"max-train", "max-test"}) {
      const int64_t value = vm.count(name) ? vm[name].as<int64_t>() : 0;
      if (value < 0)
        throw ConfigError(std::string("--") + name + " must be >= 0, got " + std::to_string(value));
    }
    if (vm.count("num-classes") && (num_classes < 1 || num_classes > kMaxDerivedClasses))
      throw ConfigError("--num-classes must be in [1, " + std::to_string(kMaxDerivedClasses) +
                        "], got " + std::to_string(num_classes));
    const bool image_folder = !args.empty() && parse_source_format(args[0]) ==
                                                   SourceFormat::kImageFolder;
    const bool image_folder_options_given = vm.count("size") || vm.count("test-fraction") ||
                                            vm.count("seed") || skip_bad_images ||
                                            rank_zero_writes;
    if (!image_folder) {
      if (image_folder_options_given)
        throw ConfigError("--size, --test-fraction, --seed, --skip-bad-images and "
                          "--rank-zero-writes belong to convert imagefolder");
      const ConvertOptions options{max_train, max_test, parse_image_layout(layout), num_classes};
      return convert(args, options, vm.count("layout") || vm.count("num-classes"));
    }
    if (args.size() != 3)
      throw ConfigError("convert imagefolder takes ROOT OUT.h5 (got " +
                        std::to_string(args.size() - 1) + " arguments)");
    if (vm.count("max-train") || vm.count("max-test") || vm.count("layout") ||
        vm.count("num-classes"))
      throw ConfigError("--max-train, --max-test, --layout and --num-classes do not apply to "
                        "convert imagefolder");
    if (!vm.count("size")) throw ConfigError("convert imagefolder needs --size HxW");
    if (vm.count("seed") && !vm.count("test-fraction"))
      throw ConfigError("--seed chooses the --test-fraction split; give --test-fraction too");
    ImageFolderOptions options;
    parse_image_folder_size(image_size, options);
    if (vm.count("test-fraction")) options.test_fraction = test_fraction;
    options.seed = seed;
    options.skip_bad_images = skip_bad_images;
    options.rank_zero_writes = rank_zero_writes;
    return convert_image_folder_command(args, options, &argc, &argv);
  }
  if (vm.count("max-train") || vm.count("max-test") || vm.count("layout") ||
      vm.count("num-classes") || vm.count("size") || vm.count("test-fraction") ||
      vm.count("seed") || skip_bad_images || rank_zero_writes)
    throw ConfigError("--max-train, --max-test, --layout, --num-classes, --size, "
                      "--test-fraction, --seed, --skip-bad-images and --rank-zero-writes belong "
                      "to convert");
  if (command == "shard") {
    if (!vm.count("shards")) throw ConfigError("shard needs --shards K");
    return shard(args, shards);
  }
  if (command == "inspect") {
    if (args.size() != 1) throw ConfigError("inspect takes one FILE.h5");
    const bool shard_set = resolve_dataset_sources(args[0]).is_set();  // a pattern or an index
    const std::string description =
        shard_set ? describe_dataset_shards(args[0]) : describe_dataset_file(args[0]);
    std::fputs(description.c_str(), stdout);
    return kExitOk;
  }
  if (command == "export") return export_weights(args);
  throw ConfigError("unknown command '" + command +
                    "' (expected convert, inspect, shard or export)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "hpc_train_data: error: %s\n", e.what());
    if (e.exit_code() == kExitUsageError)
      std::fprintf(stderr, "run 'hpc_train_data --help' for usage\n");
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpc_train_data: error: %s\n", e.what());
    return kExitRuntimeError;
  }
}
