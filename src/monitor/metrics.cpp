#include "hpc_train/monitor/metrics.h"

#include "hpc_train/error.h"

namespace hpc_train {

JsonlWriter::JsonlWriter(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw Error("cannot open " + path + " for writing");
}

void JsonlWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw Error("cannot write to " + path_);
}

}  // namespace hpc_train
