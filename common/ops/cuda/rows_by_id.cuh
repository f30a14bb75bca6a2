#pragma once
// Sums of rows grouped by an id, deterministic and in O(N C): the embedding gradient
// (dwte[v] += the dout rows of the tokens equal to v) and index_add_rows.
//
// The direct way gives each (table row, column) a thread that walks all N ids and adds the rows
// whose id matches: O(R C N) work, 2 ms a step for gpt-85m's token embedding on an H100 (version
// 1, kept as embedding_backward_v1). Here the positions are first grouped by id with a stable
// radix sort of (id, position) pairs (CUB, part of the CUDA toolkit), then each (table row,
// column) thread adds only its own rows: O(N C) work, 0.5 ms. The sort is stable, so each row's
// positions stay in increasing order: the same additions in the same order as the direct way,
// the same bits (no atomics).
//
// What is left of those 0.5 ms is one group: a thread sums its row's positions one after the
// other, so the most frequent id sets the time (a byte-level corpus: the space, ~1 token in 6,
// ~2800 of gpt-85m's 16384). On trial ("grouped_rows_in_chunks", trial_kernels.hpp): each group
// cut into chunks of kGroupChunk positions, every chunk summed by its own thread, then each row
// adds its chunks' sums in order. Still deterministic (a fixed order), but no longer the direct
// way's order: the bits differ from version 1's in the last place.
#include "common/ops/cuda/kernels.cuh"
#include "common/tensor.hpp"

namespace scalelab::ops::cuda {

/// The positions 0..N-1 grouped by table row: row r's are order[starts[r] .. starts[r+1]), in
/// increasing order; ids outside [lo, lo + R) (another rank's rows) are in no group.
struct RowsById {
  Tensor order;   ///< (N) i32
  Tensor starts;  ///< (R + 1) i32
};

/// Groups the N positions of `ids` (i32, on the GPU) by table row, for a table of R rows
/// holding ids [lo, lo + R). Defined in rows_cuda.cu (CUB's sort is compiled once).
RowsById group_rows_by_id(const Tensor& ids, int64_t lo, int64_t R);

/// table[r, c] (+)= the sum over row r's positions n, in increasing order, of src[n, c]: with
/// `onto_table` the sum starts from table[r, c] (index_add_rows' order), else from 0 and is
/// added to the table once (the embedding backward's). G table, S source, A arithmetic.
template <class G, class S, class A>
__global__ void add_grouped_rows_kernel(G* table, const S* src, const int32_t* order,
                                        const int32_t* starts, int64_t R, int64_t C,
                                        bool onto_table) {
  SCALELAB_GRID_STRIDE(i, R * C) {
    const int64_t r = i / C, c = i % C;
    A s = onto_table ? A(table[i]) : A(0);
    for (int32_t k = starts[r]; k < starts[r + 1]; ++k) s += A(src[int64_t{order[k]} * C + c]);
    table[i] = onto_table ? G(s) : G(A(table[i]) + s);
  }
}

/// add_grouped_rows_kernel's sums over `rows` (same meaning, same onto_table): by that kernel,
/// or in chunks (the trial kernel "grouped_rows_in_chunks"). table and src on one GPU; src (N, C)
/// of the training dtypes, table (R, C) of the gradient dtype for src's (with_grad_type).
/// Defined in rows_cuda.cu (CUB's scan is compiled once).
void add_grouped_rows(Tensor& table, const Tensor& src, const RowsById& rows, bool onto_table);

}  // namespace scalelab::ops::cuda
