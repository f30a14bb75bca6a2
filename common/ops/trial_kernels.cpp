#include "common/ops/trial_kernels.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>

#include "common/errors.hpp"

namespace scalelab::ops {

namespace {
bool known(const std::string& name) {
  return std::any_of(std::begin(kTrialKernels), std::end(kTrialKernels),
                     [&](const char* k) { return name == k; });
}

// The names in `list`, checked; `where` names the list's origin in the error.
std::set<std::string> parse(const std::string& list, const std::string& where) {
  std::set<std::string> names;
  std::istringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    if (name == "all") {
      names.insert(std::begin(kTrialKernels), std::end(kTrialKernels));
      continue;
    }
    if (!known(name)) {
      std::string all;
      for (const char* k : kTrialKernels) all += std::string(all.empty() ? "" : ", ") + k;
      throw UsageError(where + ": no trial kernel '" + name + "' (all, " + all + ")");
    }
    names.insert(name);
  }
  return names;
}

std::optional<std::set<std::string>> g_names;  // read from the environment at the first call

const std::set<std::string>& names() {
  if (!g_names) {
    const char* env = std::getenv("SCALELAB_TRY_GPU_KERNELS");
    const std::string list = env ? env : "";
    g_names = parse(list, "SCALELAB_TRY_GPU_KERNELS=" + list);
  }
  return *g_names;
}
}  // namespace

bool trial_kernel(const char* name) {
  SCALELAB_CHECK(known(name), "trial_kernel: '{}' is not in kTrialKernels", name);
  return names().count(name) > 0;
}

void set_trial_kernels(const std::string& list) {
  g_names = parse(list, "set_trial_kernels(\"" + list + "\")");
}

std::string trial_kernel_list() {
  std::string list;
  for (const char* k : kTrialKernels)
    if (names().count(k)) list += std::string(list.empty() ? "" : ",") + k;
  return list;
}

}  // namespace scalelab::ops
