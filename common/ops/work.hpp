#pragma once
/// @file work.hpp
/// Work accounting: the tensor ops count the work this process asked them to do, whatever the
/// device, as the communicators count bytes (common/comm/stats.hpp). Graders read them to see
/// WHERE the work happens, not only that the numbers come out right: a tensor-parallel rank must
/// do 1/tp of a layer's GEMM FLOPs (every rank computing the whole layer gives the right numbers
/// too), and with sequence parallelism a LayerNorm runs on N/tp rows.
///
///   const ops::WorkCount before = ops::work_stats();
///   block.forward(x, acts);
///   const ops::WorkCount did = ops::work_stats() - before;   // did.matmul_flops, ...
///
/// What is counted, at the op's dispatch (after its argument checks), whatever the device: every
/// matrix multiply, separate, batched or fused, so work done through one op instead of another
/// still shows (lab 11: masked blocks computed through batched_matmul count as much as through
/// flash attention):
///   matmul, batched_matmul, linear_forward / linear_gelu_forward   2*M*N*K FLOPs per matrix
///   flash_attention_forward    its 2 fused GEMMs (q k^T, p v): 4*hs FLOPs per score pair
///   flash_attention_backward   its 5 fused GEMMs (q k^T again, dout v^T, p^T dout, ds k,
///                              ds^T q): 10*hs FLOPs per score pair
///   layernorm_forward, residual_layernorm_forward, layernorm_backward   the rows (N of (N, C))
/// and flash attention's (query, key) score pairs: BH*T*(T+1)/2 causal, BH*T*T unmasked.
#include <cstdint>

namespace scalelab::ops {

/// The work this process's tensor ops did: what a grader reads to check that a rank computed
/// its share (1/tp of a layer's GEMMs, N/tp rows of a LayerNorm) and not the whole.
struct WorkCount {
  std::int64_t matmul_calls = 0;    ///< matrix multiply calls (a fused attention: its GEMMs)
  std::int64_t matmul_flops = 0;    ///< 2*M*N*K per matrix multiply, fused ones included
  std::int64_t layernorm_rows = 0;  ///< rows normalized (forward) or differentiated (backward)
  std::int64_t attention_pairs = 0; ///< fused attention's (query, key) scores computed
  /// Equal on every counter.
  bool operator==(const WorkCount&) const = default;
};

/// This process's counters since the start or the last reset. Thread safe.
WorkCount work_stats();
/// Sets them to zero.
void reset_work_stats();
/// after - before, field by field.
WorkCount operator-(const WorkCount& after, const WorkCount& before);

/// Counts `batch` matrix multiplies of (M, K) x (K, N). Called by the ops' dispatchers (not by
/// labs).
void count_matmul(std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K);
/// Counts `rows` LayerNorm rows. Called by the ops' dispatchers (not by labs).
void count_layernorm_rows(std::int64_t rows);
/// Fused attention of bh heads of t queries against t keys of head size hs, causal or not: its
/// score pairs, and its GEMMs' calls and FLOPs (2 GEMMs forward, 5 with `backward`). Called by
/// the flash attention dispatchers (not by labs).
void count_attention(std::int64_t bh, std::int64_t t, std::int64_t hs, bool causal,
                     bool backward);

}  // namespace scalelab::ops
