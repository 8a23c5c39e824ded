// The edit distance between two names (edit_distance.h).
#include "config/edit_distance.h"

#include <algorithm>
#include <vector>

namespace hpc_train {

size_t edit_distance(const std::string& from, const std::string& to) {
  // One row of the dynamic-programming table at a time: row[j] is the distance between the
  // first i characters of `from` and the first j of `to`.
  std::vector<size_t> row(to.size() + 1);
  for (size_t j = 0; j <= to.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= from.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= to.size(); ++j) {
      const size_t substituted = diagonal + (from[i - 1] == to[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substituted});
    }
  }
  return row[to.size()];
}

}  // namespace hpc_train
