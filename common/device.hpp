#pragma once
/// @file device.hpp
/// Which GPUs this process can see: what `--device auto` and the GPU tests (label gpu, skipped
/// without one) ask before they pick a device. Compiled from device_cuda.cu with CUDA, from
/// device_nocuda.cpp without it (then there are no GPUs).
#include <string>

namespace scalelab {

/// True when this build has CUDA kernels and the NCCL backend.
bool cuda_compiled();

/// Number of CUDA devices visible to this process; 0 without CUDA, a driver or a device.
int cuda_device_count();

/// The device's name ("NVIDIA H100 80GB HBM3"), or "" if there is no such device.
std::string cuda_device_name(int device);

/// The device's UUID as nvidia-smi prints it ("GPU-1d9c1f2a-..."), or "" if there is no such
/// device. The same physical GPU has the same UUID in every process, whatever its index there:
/// under SLURM's one GPU per task (CUDA_VISIBLE_DEVICES differs per rank) every rank's GPU is
/// device 0, and only the UUID says whether two ranks share one.
std::string cuda_device_uuid(int device);

/// The device's compute capability as 10 major + minor (90 for an H100 or H200, 80 for an A100),
/// or 0 if there is no such device: kernels compiled for one architecture only (Hopper's wgmma)
/// run where this says so.
int cuda_compute_capability(int device);

}  // namespace scalelab
