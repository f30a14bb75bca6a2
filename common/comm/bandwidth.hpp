#pragma once
/// @file bandwidth.hpp
/// Bandwidth figures as nccl-tests defines them (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
///
///     algbw = bytes / time            what the application sees
///     busbw = algbw * factor          the busiest link's traffic: comparable across collectives and
///                                     rank counts, and with the hardware's link bandwidth
///
/// where `bytes` is the size of the (largest) buffer of the operation: the whole vector for
/// all_reduce, the gathered output for all_gather, the input for reduce_scatter. Lab 01's step 4
/// writes its own all_reduce factor; its graders compare it with busbw_factor here.
#include <string_view>

namespace scalelab::comm {

/// busbw / algbw for `collective` over `ranks` ranks: 2(n-1)/n for all_reduce; (n-1)/n for
/// all_gather, reduce_scatter and all_to_all; 1 for broadcast, reduce, send/recv (a copy moves
/// each byte once). Throws UsageError for an unknown name or ranks < 1.
double busbw_factor(std::string_view collective, int ranks);

/// The algorithm bandwidth in bytes per second: `bytes` (the operation's largest buffer) over
/// `seconds` of wall time; 0 when `seconds` is not positive.
double algbw(double bytes, double seconds);
/// The bus bandwidth in bytes per second: algbw(bytes, seconds) x busbw_factor(collective, ranks),
/// the figure to hold against a link's data-sheet bandwidth (an all_reduce at busbw B keeps every
/// link at B, whatever the rank count). Throws UsageError as busbw_factor does.
double busbw(std::string_view collective, int ranks, double bytes, double seconds);

}  // namespace scalelab::comm
