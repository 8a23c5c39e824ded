// The INI config file (--config FILE, Boost.ProgramOptions and the checks around it), then
// validation, and the round trip that config.h promises: to_ini's text, read back with --config,
// gives the same configuration.
#include "fuzz_support.h"
#include "hpc_train/config/config.h"

using namespace hpc_train;

namespace {

TrainConfig read_config(const std::string& path) {
  const char* argv[] = {"hpc_train", "--config", path.c_str()};
  return parse_command_line(3, argv).config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("config.ini");
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::parse_or_reject([&] {
    const TrainConfig config = read_config(path);
    const std::string ini = to_ini(config);
    const std::string round_trip_path = fuzz::scratch_path("round_trip.ini");
    fuzz::write_file(round_trip_path, ini);
    TrainConfig again;
    try {
      again = read_config(round_trip_path);
    } catch (const Error& e) {
      fuzz::fail_unless(false, std::string("to_ini's text does not read back: ") + e.what());
    }
    fuzz::fail_unless(to_ini(again) == ini, "to_ini's text reads back as another configuration");
    validate(config);
  });
  return 0;
}
