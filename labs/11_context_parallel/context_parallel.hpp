#pragma once
/// @file context_parallel.hpp
/// Lab 11: context parallelism. The sequence is cut over cp ranks, for attention too: each rank
/// keeps T/cp token rows through the whole model (embedding, blocks, loss), and attention, the
/// only place where a token needs others, gets the other ranks' keys and values by a ring (steps
/// 2-3) or by one all-to-all each way (step 4, Ulysses).
///
/// Layout (Megatron-LM's zig-zag): T is cut into 2cp chunks of c = T/(2cp) tokens; rank r keeps
/// chunk r and chunk 2cp-1-r, in that order. Under the causal mask the early chunk needs few
/// keys and the late one many, so every rank computes the same number of score blocks.
///
/// The ring works on the chunk-major layout (given, layout.cpp): a rank's q (2, BH, c, hs) is
/// its two chunks, each (BH, c, hs) contiguous; its K/V block kv (2, 2, BH, c, hs) is k's two
/// chunks then v's two (one buffer: one message per ring step).
///
/// You write the functions marked "step K" in context_parallel.cpp; the ones marked "Given" are
/// in the given files named beside them. Tests (tests/11_context_parallel) touch only this.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/model_config.hpp"
#include "common/nn/gpt.hpp"
#include "common/nn/mappings.hpp"
#include "common/tensor.hpp"

namespace scalelab::lab11 {

// ---- step 1: zig-zag sharding of the sequence --------------------------------------------------

/// The global token indices of rank's T/cp rows, in the order the rank keeps them: chunk `rank`
/// then chunk 2cp-1-rank (chunks of T/(2cp) tokens). T divisible by 2cp, 0 <= rank < cp.
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank);

/// Where global token t lives: the rank holding it and its row there (the inverse of
/// zigzag_positions).
struct Owner {
  int rank = 0;
  int64_t row = 0;
  bool operator==(const Owner&) const = default;
};
Owner zigzag_owner(int64_t t, int64_t T, int cp);

/// This rank's rows of x (B, T, ...): (B, T/cp, ...), rows in zigzag_positions order. Any
/// dtype, any device (device copies, no per-element host loop).
Tensor shard_sequence(const Tensor& x, int cp, int rank);
/// The inverse: the cp ranks' shards (B, T/cp, ...), in rank order -> (B, T, ...).
Tensor unshard_sequence(const std::vector<Tensor>& shards);

// ---- given (layout.cpp): the comparison layout, the work count, chunk-major views ----------------

/// Given. The contiguous split (rank r keeps tokens [r T/cp, (r+1) T/cp)): what zig-zag beats.
std::vector<int64_t> contiguous_positions(int64_t T, int cp, int rank);
/// Given. The causal attention work of rows `positions`: how many (query chunk, key chunk)
/// score blocks of c x c (c = T/(2cp)) their queries need (key chunk <= query chunk; a
/// diagonal block counts as one). The single device computes 2cp(2cp+1)/2 in all.
int64_t causal_blocks(const std::vector<int64_t>& positions, int64_t T, int cp);
/// Given. (BH, 2c, hs) -> (2, BH, c, hs): chunk i of every head contiguous. A new tensor.
Tensor to_chunks(const Tensor& x);
/// Given. The inverse: (2, BH, c, hs) -> x (BH, 2c, hs), written into x.
void from_chunks(Tensor& x, const Tensor& chunks);
/// Given. Chunk i (0 or 1) of a chunk-major (2, BH, c, hs) tensor: (BH, c, hs), a view.
Tensor chunk(const Tensor& chunks, int i);
/// Given. Row i (0 or 1) of a chunk-major log-sum-exp (2, BH, c): query chunk i's (BH, c), a view.
Tensor lse_chunk(const Tensor& lse, int i);
/// Given. k and v (BH, 2c, hs) -> one K/V block (2, 2, BH, c, hs): k's chunks, then v's.
Tensor pack_kv(const Tensor& k, const Tensor& v);
/// Given. The k (which = 0) or v (1) half of a K/V block: (2, BH, c, hs), a view.
Tensor kv_part(const Tensor& kv, int which);

// ---- step 2: ring attention, forward ---------------------------------------------------------

/// Causal attention of this rank's queries over the WHOLE sequence, the keys and values coming
/// round the ring of `cp` (rank r receives from r-1, sends to r+1). q, y (2, BH, c, hs) and kv
/// (2, 2, BH, c, hs) in the chunk-major layout of this rank's zig-zag rows. Sets y; returns the
/// log-sum-exp of each query row, (2, BH, c) f32 (f64 for f64 data), for backward.
Tensor ring_attention_forward(Tensor& y, const Tensor& q, const Tensor& kv, double scale,
                              comm::Communicator& cp);

// ---- step 3: ring attention, backward --------------------------------------------------------

/// Sets dq (2, BH, c, hs) and dkv (2, 2, BH, c, hs), the gradients of this rank's queries and of
/// its own K/V block, from dy (2, BH, c, hs); y and lse are what the forward gave.
void ring_attention_backward(Tensor& dq, Tensor& dkv, const Tensor& dy, const Tensor& q,
                             const Tensor& kv, const Tensor& y, const Tensor& lse, double scale,
                             comm::Communicator& cp);

// ---- step 4 (optional): all-to-all attention (DeepSpeed-Ulysses) ------------------------------

/// The same attention with the heads split instead of the sequence: all-to-alls give each rank
/// NH/cp heads over the whole sequence, causal flash attention runs there, and one all-to-all
/// brings every rank its rows of every head back. q, k, v, y (B*NH, T/cp, hs): this rank's
/// zig-zag rows of all NH heads (B = batch rows, NH divisible by cp). Returns the log-sum-exp of
/// its heads' rows, (B*NH/cp, T); puts in `kept` whatever else backward needs.
Tensor all_to_all_attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v,
                                    int64_t n_head, double scale, comm::Communicator& cp,
                                    std::vector<Tensor>& kept);
/// Sets dq, dk, dv (B*NH, T/cp, hs) from dy; lse and `kept` as the forward gave them.
void all_to_all_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dy,
                                   const Tensor& lse, const std::vector<Tensor>& kept,
                                   int64_t n_head, double scale, comm::Communicator& cp);

// ---- given (layout.cpp): the head-split layouts of step 4 ----------------------------------------

/// Given. (B*NH, T/cp, hs) -> (cp, B*NH/cp, T/cp, hs): part j is every batch row's heads
/// [j NH/cp, (j+1) NH/cp), what goes to rank j in an all-to-all. A new tensor.
Tensor heads_out(const Tensor& x, int64_t n_head, int cp);
/// Given. The inverse: part j (from rank j: my rows of its heads) back into (B*NH, T/cp, hs).
Tensor heads_in(const Tensor& parts, int64_t n_head, int cp);
/// Given. (cp, BH', T/cp, hs), part s being rank s's zig-zag rows -> (BH', T, hs) in sequence
/// order (what causal attention needs). A new tensor.
Tensor to_sequence_order(const Tensor& parts, int cp);
/// Given. The inverse: (BH', T, hs) -> (cp, BH', T/cp, hs), part s = rank s's zig-zag rows.
Tensor to_zigzag_order(const Tensor& x, int cp);

// ---- given (cp_model.cpp): the model, its step, the checks -------------------------------------

enum class Attention { ring, all_to_all };
/// "ring" or "all-to-all"; anything else is a UsageError naming --attention.
Attention parse_attention(const std::string& text);
const char* attention_name(Attention a);

/// Given. Refuses (UsageError, one line) a context-parallel run that cannot be: cp not the
/// world size, T not divisible by 2 cp, heads not divisible by cp for all-to-all.
void check_cp(int cp, int world, int64_t T, int64_t n_head, Attention attention);

/// Given. The mappings of a context-parallel GPT (nn::Mappings): the embedding of this rank's
/// rows at their global positions, and attention's core by ring (steps 2-3) or all-to-all (step
/// 4). `positions`: the rows' global indices (zigzag_positions).
std::shared_ptr<const nn::Mappings> make_cp_mappings(comm::Communicator& cp,
                                                     std::vector<int64_t> positions,
                                                     Attention attention, int64_t n_head);

/// Given. One forward + backward of `model` (built with these mappings) on the rank's rows of a
/// global batch x, y (B, T): the mean loss over all B*T tokens (the same on every rank), and the
/// model's gradients of it, summed over the cp ranks (every rank holds the single device's).
/// `shard` picks this rank's rows of a (B, T) tensor (shard_sequence).
double cp_forward_backward(nn::GPT& model, const Tensor& x, const Tensor& y,
                           comm::Communicator& cp,
                           const std::function<Tensor(const Tensor&)>& shard);

}  // namespace scalelab::lab11
