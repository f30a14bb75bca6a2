#pragma once
/// @file equivalence.hpp
/// Comparing a parallel result with the single-device one. Labs 03-06 print these figures and
/// their graders assert on them; labs 07-11's programs check their losses with TwinCheck.
/// Tolerances: the CPU kernels are deterministic (one OpenBLAS thread per rank), so what only
/// copies or recomputes (a broadcast, a batch slice, activation checkpointing) is exact; equal
/// micro-batches accumulated in order agree to 1e-6 relative; anything all-reduced (the sum runs
/// in another order) to 1e-5 relative / 1e-6 absolute after one step, and over several steps only
/// with plain SGD (AdamW amplifies rounding); CUDA against the CPU, fp32 with TF32 off, to 1e-4
/// relative. Each test states its own next to it (tests/support/lab_fixture.hpp for the labs'
/// graders).
///
///     train::Diff d = train::compare(ddp_grads, reference_grads);
///     if (!d.within(1e-5, 1e-6)) ...   // all-reduce changed the summation order
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/communicator.hpp"
#include "common/tensor.hpp"

namespace scalelab::train {

/// How far `got` is from `want`, element by element (same numel; any float dtype, any device).
struct Diff {
  double max_abs = 0;        ///< max |got - want|
  /// max |got - want| / max |want|: the error against the tensor's scale.
  double max_rel = 0;
  int64_t worst_index = -1;  ///< flat index of the largest |got - want|; -1 if none
  int64_t n = 0;             ///< elements compared
  bool bitwise = true;       ///< every element identical (what copies and recomputation must give)
  /// Elementwise |got - want| <= atol + rtol * |want| (numpy's isclose).
  bool within(double rtol, double atol) const { return rtol_atol_ok(rtol, atol); }
  /// One line for a failure message: "max |diff| 2e-07 at element 12 (got ..., want ...),
  /// 1e-07 of max |want|" (max_rel), or "bitwise equal (N elements)". Of a tensor of 2 or more
  /// dimensions the element is also named by its index: "at element 12 = [1, 4] of (2, 8)".
  std::string str() const;
  /// `want`'s shape: str() names the worst element by its index in it.
  std::vector<int64_t> shape;

  /// Filled by compare(): the elements of `got` as doubles, so within() can test any tolerance.
  std::vector<double> got_;
  /// Filled by compare(): the elements of `want` as doubles.
  std::vector<double> want_;

 private:
  bool rtol_atol_ok(double rtol, double atol) const;
};

/// Compares `got` with `want` element by element (same numel; any float dtype, any device: both
/// are read to the host). Local: no communication; compare each rank's shard with its cut of the
/// single-device tensor.
Diff compare(const Tensor& got, const Tensor& want);

/// A parallel run's losses beside its single-device twin's (same seed, global batches and
/// precision), step by step. The twin must be followed within `tolerance` relative: fp32 1e-5 (the
/// parallel sums run in another order), bf16 1e-3 (every activation rounds to 8 bits, and ranks
/// round their partial sums to bf16 before adding them). Labs 07-10 exit 1 when it is not.
struct TwinCheck {
  /// The tolerance for a run in `precision`: bf16 1e-3 relative, anything else 1e-5.
  explicit TwinCheck(DType precision) : tolerance(precision == DType::bf16 ? 1e-3 : 1e-5) {}
  double tolerance;  ///< relative: |loss - twin| may be at most tolerance x |twin|
  double worst = 0;  ///< the largest |loss - twin| recorded
  bool ok = true;    ///< every step within tolerance (and every loss finite)
  bool diverged = false;  ///< a loss was nan or inf: training diverged (both may agree on it)
  /// Records one step; false (and ok false from then on) when |loss - twin| > tolerance * |twin|
  /// or either loss is not finite.
  bool add(double loss, double twin);
  /// "within 1e-05 relative", "MORE THAN 1e-05 relative", or that the loss is not finite.
  std::string verdict() const;
};

/// True on every rank of `comm` when `ok` is true on every rank (a logical AND all-reduce).
bool on_every_rank(bool ok, comm::Communicator& comm);

/// The largest |t - rank 0's t| over every element and rank (0 when all ranks hold the same
/// values): rank 0's copy is broadcast and compared; the max is all-reduced.
double max_divergence_from_rank0(const Tensor& t, comm::Communicator& comm);

}  // namespace scalelab::train
