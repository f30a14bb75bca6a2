#pragma once
// Bandwidth figures as nccl-tests defines them (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
//   algbw = bytes / time            what the application sees
//   busbw = algbw * factor          the busiest link's traffic: comparable across collectives and
//                                   rank counts, and with the hardware's link bandwidth
// where `bytes` is the size of the (largest) buffer of the operation: the whole vector for
// all_reduce, the gathered output for all_gather, the input for reduce_scatter.
#include <string_view>

namespace scalelab::comm {

/// busbw / algbw for `collective` over `ranks` ranks: 2(n-1)/n for all_reduce; (n-1)/n for
/// all_gather, reduce_scatter and all_to_all; 1 for broadcast, reduce, send/recv (a copy moves
/// each byte once). Throws UsageError for an unknown name or ranks < 1.
double busbw_factor(std::string_view collective, int ranks);

/// Bytes per second.
double algbw(double bytes, double seconds);
double busbw(std::string_view collective, int ranks, double bytes, double seconds);

}  // namespace scalelab::comm
