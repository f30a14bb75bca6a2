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
bool in(const char* name, const char* const* begin, const char* const* end) {
  return std::any_of(begin, end, [&](const char* k) { return std::string(name) == k; });
}
bool checked(const std::string& name) {
  return in(name.c_str(), std::begin(kCheckedKernels), std::end(kCheckedKernels));
}
bool known(const std::string& name) {
  return checked(name) || in(name.c_str(), std::begin(kTrialKernels), std::end(kTrialKernels));
}

// The kernels on after `list` is applied to the default; `where` names the list's origin in the
// error.
std::set<std::string> parse(const std::string& list, const std::string& where) {
  std::set<std::string> on(std::begin(kCheckedKernels), std::end(kCheckedKernels));
  std::istringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    if (item == "all" || item == "none") {
      on.clear();
      if (item == "all") {
        on.insert(std::begin(kCheckedKernels), std::end(kCheckedKernels));
        on.insert(std::begin(kTrialKernels), std::end(kTrialKernels));
      }
      continue;
    }
    const bool off = item[0] == '-';
    const std::string name = off ? item.substr(1) : item;
    if (!known(name)) {
      std::string every;
      for (const char* k : kTrialKernels) every += std::string(", ") + k;
      for (const char* k : kCheckedKernels) every += std::string(", ") + k;
      throw UsageError(where + ": no GPU kernel '" + name + "' (all, none" + every +
                       "; -name turns one off)");
    }
    if (off) on.erase(name);
    else on.insert(name);
  }
  return on;
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
  SCALELAB_CHECK(known(name), "trial_kernel: '{}' is in neither kTrialKernels nor kCheckedKernels",
                 name);
  return names().count(name) > 0;
}

void set_trial_kernels(const std::string& list) {
  g_names = parse(list, "set_trial_kernels(\"" + list + "\")");
}

std::string trial_kernel_list() {
  std::string list;
  auto add = [&](const std::string& item) { list += (list.empty() ? "" : ",") + item; };
  for (const char* k : kCheckedKernels)
    if (!names().count(k)) add(std::string("-") + k);
  for (const char* k : kTrialKernels)
    if (names().count(k)) add(k);
  return list;
}

}  // namespace scalelab::ops
