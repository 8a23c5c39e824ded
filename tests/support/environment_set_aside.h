// Environment variables set aside for one test and put back after it: the tests run under mpirun,
// whose variables (OMPI_COMM_WORLD_*, OMPI_MCA_*) the code under test reads, and a test that sets
// its own must leave the process's as they were, whichever way it ends.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hpc_train::testing {

class EnvironmentSetAside {
 public:
  // Unsets `names`, keeping the values they had.
  explicit EnvironmentSetAside(std::vector<std::string> names) : names_(std::move(names)) {
    for (const std::string& name : names_) {
      const char* value = std::getenv(name.c_str());
      saved_.push_back(value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name.c_str());
    }
  }
  // Each name back to its value, or unset where it had none.
  ~EnvironmentSetAside() {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (saved_[i])
        setenv(names_[i].c_str(), saved_[i]->c_str(), 1);
      else
        unsetenv(names_[i].c_str());
    }
  }
  EnvironmentSetAside(const EnvironmentSetAside&) = delete;
  EnvironmentSetAside& operator=(const EnvironmentSetAside&) = delete;

 private:
  std::vector<std::string> names_;
  std::vector<std::optional<std::string>> saved_;
};

}  // namespace hpc_train::testing
