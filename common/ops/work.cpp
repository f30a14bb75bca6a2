// The work counters of work.hpp: relaxed atomics (an op may run on a communicator's worker thread,
// e.g. a bf16 reduction), read as one snapshot.
#include "common/ops/work.hpp"

#include <atomic>

namespace scalelab::ops {

namespace {
std::atomic<std::int64_t> g_calls{0}, g_flops{0}, g_rows{0}, g_pairs{0};
}  // namespace

WorkCount work_stats() {
  return {g_calls.load(std::memory_order_relaxed), g_flops.load(std::memory_order_relaxed),
          g_rows.load(std::memory_order_relaxed), g_pairs.load(std::memory_order_relaxed)};
}

void reset_work_stats() {
  g_calls = 0;
  g_flops = 0;
  g_rows = 0;
  g_pairs = 0;
}

WorkCount operator-(const WorkCount& a, const WorkCount& b) {
  return {a.matmul_calls - b.matmul_calls, a.matmul_flops - b.matmul_flops,
          a.layernorm_rows - b.layernorm_rows, a.attention_pairs - b.attention_pairs};
}

void count_matmul(std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  g_flops.fetch_add(2 * batch * M * N * K, std::memory_order_relaxed);
}

void count_layernorm_rows(std::int64_t rows) { g_rows.fetch_add(rows, std::memory_order_relaxed); }

void count_attention(std::int64_t bh, std::int64_t t, std::int64_t hs, bool causal,
                     bool backward) {
  const std::int64_t pairs = bh * (causal ? t * (t + 1) / 2 : t * t), gemms = backward ? 5 : 2;
  g_pairs.fetch_add(pairs, std::memory_order_relaxed);
  // each GEMM multiplies and adds hs numbers per score pair, as batched_matmul counts them
  g_calls.fetch_add(gemms, std::memory_order_relaxed);
  g_flops.fetch_add(gemms * 2 * hs * pairs, std::memory_order_relaxed);
}

}  // namespace scalelab::ops
