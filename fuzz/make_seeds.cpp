// make_seeds: writes the seed corpora of the fuzz targets, small valid inputs made with the
// project's own writers, and checks that each one is accepted by its parser.
//
//   make_seeds OUT_DIR      writes OUT_DIR/<target>/<seed> (the committed fuzz/corpus/)
//
// corpus/torchscript_file/ is not written here: its seeds are zips that PyTorch itself wrote
// (tests/support/torchscript_models.py fuzz-seeds DIR).
//
// Rerun it when a format changes. Every seed stays small (a few KiB; CIFAR-10's fixed 3073-byte
// records make that target's seed 18 KiB), so that libFuzzer mutates inputs of a size it handles
// quickly. The seeds of the HDF5 targets are recipes of the files (Note [HDF5 recipes]).
#include <hdf5.h>
#include <mpi.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "example_checkpoints.h"
#include "fuzz_support.h"
#include "hdf5_recipe.h"
#include "hpc_train/io/checkpoint.h"
#include "hpc_train/config/config.h"
#include "hpc_train/data/converters.h"
#include "hpc_train/config/deepspeed_config.h"
#include "hpc_train/io/safetensors.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

fs::path out_dir;

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(out_dir / target);
  fuzz::write_file((out_dir / target / name).string(), bytes);
  std::printf("%s/%s: %zu bytes\n", target.c_str(), name.c_str(), bytes.size());
}

std::string big_endian(uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
          static_cast<char>(value >> 8), static_cast<char>(value)};
}

// gzip (RFC 1952) of `bytes`, as the published IDX files are.
std::string gzip(const std::string& bytes) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error("deflateInit2 failed");
  std::string out(deflateBound(&stream, bytes.size()), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) throw Error("deflate failed");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// Note [HDF5 recipes]: the recipe of the file at `path`, once `parse` has accepted the file that
// it rebuilds.
template <class Parse>
std::string checked_recipe(const std::string& path, Parse&& parse) {
  const std::string recipe = fuzz::recipe_of_hdf5_file(path);
  const std::string rebuilt = fuzz::scratch_path("rebuilt.h5");
  fuzz::build_hdf5_file(reinterpret_cast<const uint8_t*>(recipe.data()), recipe.size(), rebuilt);
  parse(rebuilt);
  return recipe;
}

// Note [Several files in one input]: the files of a converter's source directory, written there
// (to check that the converter accepts them) and joined into one seed.
std::string converter_seed(SourceFormat format, const std::vector<std::string>& names,
                           const std::vector<std::string>& files) {
  const fs::path directory = fs::path(fuzz::scratch_directory()) / "source";
  fs::remove_all(directory);
  fs::create_directories(directory);
  std::string seed;
  for (size_t i = 0; i < files.size(); ++i) {
    fuzz::write_file((directory / names[i]).string(), files[i]);
    seed += (i ? std::string(fuzz::kFileSeparator) : "") + files[i];
  }
  read_source_dataset(format, directory.string(), ConvertOptions{});
  return seed;
}

void idx_seeds() {
  const std::vector<std::string> names = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  auto images = [](uint32_t n, uint32_t height, uint32_t width, int salt) {
    std::string bytes = big_endian(0x803) + big_endian(n) + big_endian(height) + big_endian(width);
    for (uint32_t i = 0; i < n * height * width; ++i) bytes += static_cast<char>(i * 37 + salt);
    return bytes;
  };
  auto labels = [](uint32_t n, int salt) {
    std::string bytes = big_endian(0x801) + big_endian(n);
    for (uint32_t i = 0; i < n; ++i) bytes += static_cast<char>((i + salt) % 10);
    return bytes;
  };
  const std::vector<std::string> raw = {images(3, 4, 5, 1), labels(3, 0), images(2, 4, 5, 2),
                                        labels(2, 7)};
  write_seed("idx", "raw", converter_seed(SourceFormat::kMnist, names, raw));
  std::vector<std::string> zipped;
  for (const std::string& file : raw) zipped.push_back(gzip(file));
  write_seed("idx", "gzip", converter_seed(SourceFormat::kMnist, names, zipped));
}

void cifar10_seeds() {
  const std::vector<std::string> names = {"data_batch_1.bin", "data_batch_2.bin",
                                          "data_batch_3.bin", "data_batch_4.bin",
                                          "data_batch_5.bin", "test_batch.bin"};
  std::vector<std::string> files;
  for (int b = 0; b < 6; ++b) {
    std::string record(1 + 3 * 32 * 32, '\0');
    record[0] = static_cast<char>(b + 3);
    for (size_t i = 1; i < record.size(); ++i) record[i] = static_cast<char>(i * 13 + b);
    files.push_back(record);
  }
  write_seed("cifar10", "one_record_each", converter_seed(SourceFormat::kCifar10, names, files));
}

void dataset_file_seeds() {
  DatasetContents contents;
  contents.info.num_classes = 3;
  contents.info.class_names = {"zero", "one", "two"};
  contents.info.channels = 2;
  contents.info.height = 2;
  contents.info.width = 3;
  contents.info.source = "make_seeds";
  for (int i = 0; i < 3 * 12; ++i) contents.train_images.push_back(static_cast<uint8_t>(i * 7));
  contents.train_labels = {0, 2, 1};
  for (int i = 0; i < 12; ++i) contents.test_images.push_back(static_cast<uint8_t>(i * 11));
  contents.test_labels = {1};
  const std::string path = fuzz::scratch_path("dataset.h5");
  write_dataset_file(path, contents);
  write_seed("dataset_file", "tiny", checked_recipe(path, [](const std::string& rebuilt) {
               DatasetFile::open(rebuilt);
             }));
}

void checkpoint_and_safetensors_seeds() {
  for (const bool fp16 : {false, true}) {
    const std::string name = fp16 ? "fp16" : "fp32";
    const Checkpoint checkpoint = test_support::tiny_checkpoint(fp16);
    const std::string path = fuzz::scratch_path(name + ".h5");
    write_checkpoint(MPI_COMM_SELF, path, checkpoint, CheckpointWriteMode::kRankZero);
    write_seed("checkpoint", name, checked_recipe(path, [](const std::string& rebuilt) {
                 read_checkpoint(rebuilt);
               }));

    if (fp16) {
      // Older versions, as their writers left them: version 2 without the CUDA generator's state
      // that version 3 added, version 1 also without the attributes that version 2 added.
      const auto set_version = [](hid_t file, int64_t version) {
        H5Adelete(file, "format_version");
        const hid_t space = H5Screate(H5S_SCALAR);
        const hid_t attribute =
            H5Acreate2(file, "format_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(attribute, H5T_NATIVE_INT64, &version);
        H5Aclose(attribute);
        H5Sclose(space);
      };
      const auto reads_as = [](int version) {
        return [version](const std::string& rebuilt) {
          if (read_checkpoint(rebuilt).format_version != version)
            throw Error("the version " + std::to_string(version) + " seed reads as another version");
        };
      };
      hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      H5Ldelete(file, "/training/cuda_rng_state", H5P_DEFAULT);
      set_version(file, 2);
      H5Fclose(file);
      write_seed("checkpoint", "fp16_version2", checked_recipe(path, reads_as(2)));

      file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      for (const auto& [object, attribute] :
           {std::pair{"/training", "samples_in_epoch"}, {"/training", "micro_batch"},
            {"/training", "grad_accum"}, {"/loss_scaler", "dynamic"}})
        H5Adelete_by_name(file, object, attribute, H5P_DEFAULT);
      set_version(file, 1);
      H5Fclose(file);
      write_seed("checkpoint", "fp16_version1", checked_recipe(path, reads_as(1)));
    }

    const std::string weights = fuzz::scratch_path(name + ".safetensors");
    write_weights_safetensors(weights, checkpoint);
    read_safetensors_header(weights);
    write_seed("safetensors", "weights_" + name, read_file(weights));
  }
  // Every dtype, a zero-size tensor, no metadata.
  std::vector<SafetensorsEntry> entries;
  std::vector<std::vector<uint8_t>> buffers;
  const char* const dtypes[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                "BF16", "I32", "U32", "F32", "I64",     "U64",     "F64"};
  for (const char* dtype : dtypes) {
    const size_t bytes = safetensors_dtype_bytes(dtype) * 2;
    buffers.emplace_back(bytes, static_cast<uint8_t>(bytes));
    entries.push_back({std::string("t_") + dtype, dtype, {2}, nullptr, bytes});
  }
  entries.push_back({"empty", "F32", {0, 4}, nullptr, 0});
  for (size_t i = 0; i < buffers.size(); ++i) entries[i].data = buffers[i].data();
  const std::string path = fuzz::scratch_path("dtypes.safetensors");
  write_safetensors(path, entries);
  read_safetensors_header(path);
  write_seed("safetensors", "dtypes", read_file(path));
}

void deepspeed_config_seeds() {
  const std::pair<const char*, const char*> seeds[] = {
      {"origin", R"({"train_batch_size": 64, "fp16": {"enabled": true},
 "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8,
 "weight_decay": 0.01}}, "zero_optimization": {"stage": 2}})"},
      {"everything", R"({
  "train_batch_size": 96, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.99], "eps": 1e-6,
                "weight_decay": 0.1, "adam_w_mode": true, "torch_adam": false}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
           "hysteresis": 3, "min_loss_scale": 2, "consecutive_hysteresis": false,
           "auto_cast": false},
  "bf16": {"enabled": false},
  "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,
                        "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
                        "allgather_partitions": true, "offload_optimizer": {"device": "none"},
                        "offload_param": {"device": "none"}},
  "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": false,
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000,
                "warmup_num_steps": 100, "warmup_min_ratio": 0.01, "cos_min_ratio": 0.001,
                "warmup_type": "linear", "last_batch_iteration": -1}}
})"},
      {"warmup_bf16", R"({"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": true},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.002,
 "warmup_num_steps": 50, "warmup_type": "log"}}, "zero_optimization": {"stage": 0}})"},
      // Hugging Face's template style ("auto"), the monitor blocks, and keys that only warn.
      {"hf_auto_monitors", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
 "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
 "weight_decay": "auto"}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
 "warmup_num_steps": "auto"}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "sub_group_size": 1e9},
 "tensorboard": {"enabled": true, "output_path": "tb", "job_name": "job"},
 "csv_monitor": {"enabled": true}, "wandb": {"enabled": true}, "flops_profiler": {},
 "prescale_gradients": false})"},
      // FusedLamb's keys, and OneCycle cycling its beta1.
      {"lamb_one_cycle", R"({"train_batch_size": 8,
 "optimizer": {"type": "Lamb", "params": {"lr": 0.002, "betas": [0.9, 0.999], "eps": 1e-6,
 "weight_decay": 0.01, "max_coeff": 10.0, "min_coeff": 0.01, "bias_correction": true,
 "eps_inside_sqrt": false, "amsgrad": false}},
 "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.0002, "cycle_max_lr": 0.002}}})"},
  };
  for (const auto& [name, text] : seeds) {
    const std::string path = fuzz::scratch_path(std::string(name) + ".json");
    fuzz::write_file(path, text);
    TrainConfig config;
    const int world_size = std::string(name) == "everything" ? 3 : 1;
    apply_deepspeed_config(DeepSpeedImport{path, false}, world_size, {}, config);
    write_seed("deepspeed_config", name, text);
  }
}

void config_ini_seeds() {
  TrainConfig changed;
  changed.dataset_path = "data/cifar10.h5";
  changed.model = "resnet18";
  changed.drop_last = true;
  changed.lr_schedule = LrScheduleKind::kWarmupCosine;
  changed.warmup_steps = 100;
  changed.precision = Precision::kBf16;
  changed.zero_stage = 2;
  changed.bucket_mb = 12.5;
  changed.clip_grad = 1.0;
  changed.seed = 18446744073709551615ull;
  changed.run_dir = "runs/seed";
  const std::pair<const char*, std::string> seeds[] = {
      {"defaults", to_ini(TrainConfig{})},
      {"changed", to_ini(changed)},
      {"origin", "# The origin recipe\n[data]\ndataset = data/fashion-mnist.h5\n\n[model]\n"
                 "model = simple_cnn\n\n[training]\nepochs = 10\nmicro_batch = 64\n"
                 "optimizer = adamw\nlr = 0.001\nbeta1 = 0.9\nbeta2 = 0.999\neps = 1e-08\n"
                 "weight_decay = 0.01\nseed = 42\n\n[output]\nlog_every = 100\n"}};
  for (const auto& [name, text] : seeds) {
    const std::string path = fuzz::scratch_path(std::string(name) + ".ini");
    fuzz::write_file(path, text);
    const char* argv[] = {"hpc_train", "--config", path.c_str()};
    validate(parse_command_line(3, argv).config);
    write_seed("config_ini", name, text);
  }
}

}  // namespace

// Open MPI and hwloc keep what MPI_Init allocates until the process ends; that is not what this
// tool is for (the fuzz targets never start MPI), so no leak report at exit.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  MPI_Init(&argc, &argv);  // write_checkpoint is collective (over MPI_COMM_SELF here)
  int code = 0;
  try {
    idx_seeds();
    cifar10_seeds();
    dataset_file_seeds();
    checkpoint_and_safetensors_seeds();
    deepspeed_config_seeds();
    config_ini_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
