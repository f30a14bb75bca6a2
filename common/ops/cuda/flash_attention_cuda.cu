// Flash attention on a GPU: the tiled online-softmax algorithm of ops/cpu/flash_attention_cpu.cpp
// (read that first; the same names are used here), one thread block per (batch*head, tile of
// query rows) as in FlashAttention-2 (Dao 2023). What the GPU adds:
//  - each thread owns one row (a query row in forward and in the dQ pass, a key row in the dK/dV
//    pass) and keeps that row's vectors and accumulators in registers (HS is a template
//    parameter so the per-row arrays are registers, not local memory);
//  - the rows every thread needs (a tile of keys/values, or of queries/output gradients) are
//    staged once per tile in shared memory and read by all threads of the block (a broadcast:
//    every thread reads the same address at the same time);
//  - storage is f32, f64 or bf16; compute and accumulation in float (double for f64).
//
// Backward is two passes (a dQ kernel over query tiles, a dK/dV kernel over key tiles) instead
// of FlashAttention-2's single pass with dQ added by atomicAdd: every output row is written by
// one thread, so results are deterministic run to run (the library's rule: sums in a fixed
// order, no atomics), and each kernel is the forward's shape again. The price is computing the
// scores and p twice (about 1.4x the backward's FLOPs).
//
// This kernel uses CUDA cores (FMA), not tensor cores: it is the readable one, version 1. Version
// 2 (flash_attention_tc_cuda.cu) is FlashAttention-2 on tensor cores; set_flash_attention_version
// picks it (bf16, head size 64 or 128), and only it reads q, k, v in place from the QKV output.
#include <type_traits>

#include "common/ops/cuda/kernels.cuh"
#include "common/ops/flash_attention.hpp"
#include "common/ops/fused_backend.hpp"

namespace scalelab::ops::cuda {

namespace {
constexpr int kRows = 64;  // rows a block owns: one thread each
constexpr int kCols = 32;  // rows staged per shared-memory tile

template <class A, int HS>
__device__ inline A dot(const A* a, const A* b) {
  A s = 0;
#pragma unroll
  for (int d = 0; d < HS; ++d) s += a[d] * b[d];
  return s;
}

// Stages rows [r0, r0 + n) of a (T, HS) matrix into `tile` (n x HS, compute type), zero past T.
// Consecutive threads read consecutive elements: coalesced.
template <class S, class A, int HS>
__device__ inline void stage_rows(A* tile, const S* m, int r0, int n, int T) {
  for (int e = threadIdx.x; e < n * HS; e += blockDim.x) {
    const int r = r0 + e / HS;
    tile[e] = r < T ? A(m[(int64_t)r * HS + e % HS]) : A(0);
  }
}

// ---- forward: one thread per query row i --------------------------------------------------------
template <class S, class A, int HS>
__global__ void flash_forward_kernel(S* out, A* lse, const S* q, const S* k, const S* v, int T,
                                     A scale, bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  A* Ks = reinterpret_cast<A*>(smem);  // kCols x HS: a tile of keys
  A* Vs = Ks + kCols * HS;             // kCols x HS: the matching values
  const int64_t head = (int64_t)blockIdx.y * T * HS;
  q += head, k += head, v += head, out += head, lse += (int64_t)blockIdx.y * T;
  const int q0 = blockIdx.x * kRows, i = q0 + threadIdx.x;
  // the last key any row of the tile sees (causal: the tile's last query)
  const int last = causal ? min(q0 + kRows, T) - 1 : T - 1;
  const int lim = causal ? i : T - 1;  // the last key this row sees

  A qi[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) qi[d] = i < T ? A(q[(int64_t)i * HS + d]) : A(0), acc[d] = 0;
  A m = -INFINITY, l = 0;  // running max and sum of exp(s - m)

  for (int k0 = 0; k0 <= last; k0 += kCols) {
    __syncthreads();  // every thread is done with the previous tile
    stage_rows<S, A, HS>(Ks, k, k0, kCols, T);
    stage_rows<S, A, HS>(Vs, v, k0, kCols, T);
    __syncthreads();
    if (i >= T || k0 > lim) continue;  // past the end, or a tile wholly in this row's future
    A s[kCols];
    A tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      s[c] = k0 + c <= lim ? scale * dot<A, HS>(qi, Ks + c * HS) : A(-INFINITY);
      tile_max = max(tile_max, s[c]);
    }
    const A m_new = max(m, tile_max);
    const A correction = exp(m - m_new);  // 0 on the first tile (m = -inf)
    l *= correction;
#pragma unroll
    for (int d = 0; d < HS; ++d) acc[d] *= correction;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const A p = k0 + c <= lim ? exp(s[c] - m_new) : A(0);
      l += p;
#pragma unroll
      for (int d = 0; d < HS; ++d) acc[d] += p * Vs[c * HS + d];
    }
    m = m_new;
  }
  if (i >= T) return;
#pragma unroll
  for (int d = 0; d < HS; ++d) out[(int64_t)i * HS + d] = S(acc[d] / l);
  lse[i] = m + log(l);
}

// ---- backward ---------------------------------------------------------------------------------
// D_i = dO_i . O_i, one warp per row of (BH * T).
template <class S, class A>
__global__ void flash_backward_d_kernel(A* D, const S* dout, const S* out, int64_t rows, int hs) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  A s = 0;
  for (int d = lane(); d < hs; d += kWarp) s += A(dout[row * hs + d]) * A(out[row * hs + d]);
  s = warp_sum(s);
  if (lane() == 0) D[row] = s;
}

// Pass 1: dQ_i = scale * sum_{j <= i} dS_ij k_j, one thread per query row i; keys staged in tiles.
template <class S, class A, int HS>
__global__ void flash_backward_dq_kernel(S* dq, const S* dout, const S* q, const S* k, const S* v,
                                         const A* lse, const A* D, int T, A scale, bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  A* Ks = reinterpret_cast<A*>(smem);
  A* Vs = Ks + kCols * HS;
  const int64_t head = (int64_t)blockIdx.y * T * HS;
  q += head, k += head, v += head, dout += head, dq += head;
  lse += (int64_t)blockIdx.y * T, D += (int64_t)blockIdx.y * T;
  const int q0 = blockIdx.x * kRows, i = q0 + threadIdx.x;
  const int last = causal ? min(q0 + kRows, T) - 1 : T - 1;
  const int lim = causal ? i : T - 1;  // the last key this row sees

  A qi[HS], doi[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    qi[d] = i < T ? A(q[(int64_t)i * HS + d]) : A(0);
    doi[d] = i < T ? A(dout[(int64_t)i * HS + d]) : A(0);
    acc[d] = 0;
  }
  const A lse_i = i < T ? lse[i] : A(0), D_i = i < T ? D[i] : A(0);

  for (int k0 = 0; k0 <= last; k0 += kCols) {
    __syncthreads();
    stage_rows<S, A, HS>(Ks, k, k0, kCols, T);
    stage_rows<S, A, HS>(Vs, v, k0, kCols, T);
    __syncthreads();
    if (i >= T) continue;
    for (int c = 0; c < kCols && k0 + c <= lim; ++c) {
      const A p = exp(scale * dot<A, HS>(qi, Ks + c * HS) - lse_i);
      const A ds = p * (dot<A, HS>(doi, Vs + c * HS) - D_i);
#pragma unroll
      for (int d = 0; d < HS; ++d) acc[d] += ds * Ks[c * HS + d];
    }
  }
  if (i >= T) return;
#pragma unroll
  for (int d = 0; d < HS; ++d) dq[(int64_t)i * HS + d] = S(scale * acc[d]);
}

// Pass 2: dK_j = scale * sum_{i >= j} dS_ij q_i and dV_j = sum_{i >= j} p_ij dO_i, one thread per
// key row j; queries and output gradients staged in tiles. The block's own k and v rows are in
// shared memory too (registers would need 4 * HS per thread with the two accumulators), padded
// to HS + 1 so that thread r reading its row r, column d hits bank (r (HS+1) + d) mod 32: all
// different across a warp.
template <class S, class A, int HS>
__global__ void flash_backward_dkdv_kernel(S* dk, S* dv, const S* dout, const S* q, const S* k,
                                           const S* v, const A* lse, const A* D, int T, A scale,
                                           bool causal) {
  constexpr int P = HS + 1;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Kown = reinterpret_cast<A*>(smem);  // kRows x P
  A* Vown = Kown + kRows * P;            // kRows x P
  A* Qs = Vown + kRows * P;              // kCols x HS
  A* dOs = Qs + kCols * HS;              // kCols x HS
  A* lse_s = dOs + kCols * HS;           // kCols
  A* D_s = lse_s + kCols;                // kCols
  const int64_t head = (int64_t)blockIdx.y * T * HS;
  q += head, k += head, v += head, dout += head, dk += head, dv += head;
  lse += (int64_t)blockIdx.y * T, D += (int64_t)blockIdx.y * T;
  const int k0 = blockIdx.x * kRows, j = k0 + threadIdx.x;

  for (int e = threadIdx.x; e < kRows * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    Kown[r * P + d] = k0 + r < T ? A(k[(int64_t)(k0 + r) * HS + d]) : A(0);
    Vown[r * P + d] = k0 + r < T ? A(v[(int64_t)(k0 + r) * HS + d]) : A(0);
  }
  const A* kj = Kown + threadIdx.x * P;
  const A* vj = Vown + threadIdx.x * P;
  A dk_acc[HS], dv_acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) dk_acc[d] = 0, dv_acc[d] = 0;

  // causal: queries before k0 see none of these keys
  for (int i0 = causal ? k0 : 0; i0 < T; i0 += kCols) {
    __syncthreads();
    stage_rows<S, A, HS>(Qs, q, i0, kCols, T);
    stage_rows<S, A, HS>(dOs, dout, i0, kCols, T);
    for (int c = threadIdx.x; c < kCols; c += blockDim.x) {
      lse_s[c] = i0 + c < T ? lse[i0 + c] : A(0);
      D_s[c] = i0 + c < T ? D[i0 + c] : A(0);
    }
    __syncthreads();
    if (j >= T) continue;
    for (int c = 0; c < kCols && i0 + c < T; ++c) {
      if (causal && i0 + c < j) continue;  // query before key: masked
      A s = 0, dp = 0;
#pragma unroll
      for (int d = 0; d < HS; ++d) s += Qs[c * HS + d] * kj[d], dp += dOs[c * HS + d] * vj[d];
      const A p = exp(scale * s - lse_s[c]);
      const A ds = p * (dp - D_s[c]);
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        dv_acc[d] += p * dOs[c * HS + d];
        dk_acc[d] += ds * Qs[c * HS + d];
      }
    }
  }
  if (j >= T) return;
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    dk[(int64_t)j * HS + d] = S(scale * dk_acc[d]);
    dv[(int64_t)j * HS + d] = S(dv_acc[d]);
  }
}

// The online-softmax merge (attention_merge), one warp per row: every lane computes the row's
// weights from the old lse, then lane 0 stores the new lse once the warp has read it.
template <class S, class A>
__global__ void attention_merge_kernel(S* out, A* lse, const S* out_b, const A* lse_b,
                                       int64_t rows, int hs) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const A la = lse[row], lb = lse_b[row];
  if (lb == A(-INFINITY)) return;
  const A m = max(la, lb);
  const A merged = m + log(exp(la - m) + exp(lb - m));
  const A wa = exp(la - merged), wb = exp(lb - merged);
  for (int d = lane(); d < hs; d += kWarp)
    out[row * hs + d] = S(wa * A(out[row * hs + d]) + wb * A(out_b[row * hs + d]));
  __syncwarp();
  if (lane() == 0) lse[row] = merged;
}

// Launches `kernel` with `smem` bytes of dynamic shared memory (above the default 48 KiB a kernel
// must ask for it; an H100 has up to 227 KiB per block).
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kernel<<<grid, threads, smem>>>(args...);
  CUDA_CHECK_LAUNCH();
}

// Calls f(S{}, A{}, HS constant) for the tensors' dtype and head size.
template <class F>
void with_types(DType dtype, int64_t hs, F f) {
  auto with_hs = [&](auto s_tag, auto a_tag) {
    switch (hs) {
      case 16: f(s_tag, a_tag, std::integral_constant<int, 16>{}); break;
      case 32: f(s_tag, a_tag, std::integral_constant<int, 32>{}); break;
      case 64: f(s_tag, a_tag, std::integral_constant<int, 64>{}); break;
      case 128: f(s_tag, a_tag, std::integral_constant<int, 128>{}); break;
      default: SCALELAB_CHECK(false, "flash attention on CUDA: head size {} (16, 32, 64 or 128)", hs);
    }
  };
  switch (dtype) {
    case DType::f32: with_hs(float{}, float{}); break;
    case DType::f64: with_hs(double{}, double{}); break;
    case DType::bf16: with_hs(bf16{}, float{}); break;
    default: SCALELAB_CHECK(false, "flash attention: dtype {}", dtype_name(dtype));
  }
}

int g_last_version = 0;  // last_flash_attention_version

dim3 grid_for(int64_t BH, int64_t T) {
  SCALELAB_CHECK(BH <= 65535, "flash attention on CUDA: {} heads in a batch (at most 65535)", BH);
  return dim3(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(BH));
}
}  // namespace

int last_flash_attention_version() { return g_last_version; }

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  use_device(out);
  const int64_t rows = lse.numel(), hs = out.size(2);
  with_types(out.dtype(), 16, [&](auto s_tag, auto a_tag, auto) {  // any head size: no template
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    attention_merge_kernel<S, A><<<blocks_for_rows(rows), kThreads>>>(
        out.data<S>(), lse.data<A>(), out_b.data<S>(), lse_b.data<A>(), rows,
        static_cast<int>(hs));
    CUDA_CHECK_LAUNCH();
  });
}

bool flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, const AttentionLayout& layout, double scale,
                             bool causal) {
  if (flash_attention_version() == 2 &&
      flash_attention_v2_forward(out, lse, q, k, v, layout, scale, causal)) {
    g_last_version = 2;
    return true;
  }
  if (!layout.packed()) return false;  // version 1 reads (BH, T, hs) tensors only
  g_last_version = 1;
  use_device(out);
  const int64_t BH = q.size(0), T = q.size(1), hs = q.size(2);
  with_types(q.dtype(), hs, [&](auto s_tag, auto a_tag, auto hs_c) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    constexpr int HS = decltype(hs_c)::value;
    launch(flash_forward_kernel<S, A, HS>, grid_for(BH, T), kRows, 2 * kCols * HS * sizeof(A),
           out.data<S>(), lse.data<A>(), q.data<S>(), k.data<S>(), v.data<S>(),
           static_cast<int>(T), A(scale), causal);
  });
  return true;
}

bool flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const AttentionLayout& layout, double scale,
                              bool causal) {
  if (flash_attention_version() == 2 &&
      flash_attention_v2_backward(dq, dk, dv, dout, q, k, v, out, lse, layout, scale, causal)) {
    g_last_version = 2;
    return true;
  }
  if (!layout.packed()) return false;
  g_last_version = 1;
  use_device(dq);
  const int64_t BH = q.size(0), T = q.size(1), hs = q.size(2);
  with_types(q.dtype(), hs, [&](auto s_tag, auto a_tag, auto hs_c) {
    using S = decltype(s_tag);
    using A = decltype(a_tag);
    constexpr int HS = decltype(hs_c)::value;
    Tensor D = Tensor::empty({BH * T}, dtype_of<A>(), q.device());  // (BH * T): dO_i . O_i
    flash_backward_d_kernel<S, A><<<blocks_for_rows(BH * T), kThreads>>>(
        D.data<A>(), dout.data<S>(), out.data<S>(), BH * T, static_cast<int>(hs));
    CUDA_CHECK_LAUNCH();
    launch(flash_backward_dq_kernel<S, A, HS>, grid_for(BH, T), kRows, 2 * kCols * HS * sizeof(A),
           dq.data<S>(), dout.data<S>(), q.data<S>(), k.data<S>(), v.data<S>(), lse.data<A>(),
           D.data<A>(), static_cast<int>(T), A(scale), causal);
    const size_t smem = (2 * kRows * (HS + 1) + 2 * kCols * HS + 2 * kCols) * sizeof(A);
    launch(flash_backward_dkdv_kernel<S, A, HS>, grid_for(BH, T), kRows, smem, dk.data<S>(),
           dv.data<S>(), dout.data<S>(), q.data<S>(), k.data<S>(), v.data<S>(), lse.data<A>(),
           D.data<A>(), static_cast<int>(T), A(scale), causal);
  });
  return true;
}

}  // namespace scalelab::ops::cuda
