// The DeepSpeed ds_config.json import (apply_deepspeed_config), at 1 rank with unknown keys
// refused and at 3 ranks with them allowed, then the resolved configuration written as INI.
#include "fuzz_support.h"
#include "hpc_train/config/deepspeed_config.h"

using namespace hpc_train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("ds_config.json");
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  for (const int world_size : {1, 3}) {
    fuzz::parse_or_reject([&] {
      TrainConfig config;
      apply_deepspeed_config(DeepSpeedImport{path, /*allow_unknown_keys=*/world_size > 1},
                             world_size, {}, config);
      validate(config);
      to_ini(config);
    });
  }
  return 0;
}
