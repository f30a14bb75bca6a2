// The nccl backend: collectives on CUDA tensors with NCCL, on a communication stream of its own.
// Built only with SCALELAB_WITH_NCCL (the stub is backend_nccl_stub.cpp).
//
// Like the mpi backend, one worker thread per communicator launches the operations in
// submission order (NCCL, like MPI, needs the same order on every rank). Ordering with compute:
// at submission the caller's stream (the legacy default stream, which the tensor library uses)
// records an event, and the communication stream waits for it before the NCCL call, so the
// collective sees the data the caller's kernels wrote. Completion: an event recorded after the
// call, polled by the worker; Work::wait() returns when the data is there.
//
// What launches when (the worker thread makes every NCCL call, in submission order):
//   - a collective: as soon as the worker takes it from the queue, after the send/recvs collected
//     before it (launched first, as one group);
//   - send/recv: NCCL needs a step's send and the matching recv in one ncclGroupStart/End (a
//     send alone on the stream can wait for its peer's recv while that peer waits on its own
//     send: a deadlock), so consecutive send/recvs are collected, not launched, until
//       * the caller posts them as a batch (Communicator::send_recv_async): the batch's end
//         flushes, so the group starts when posted and the transfers run while the caller
//         computes (a ring's next K/V block under this block's kernels);
//       * or, unbatched (send_async/recv_async), the caller waits on or tests one of them: the
//         group starts only then, however long the caller computed in between;
//       * or a collective is submitted after them, or the communicator is destroyed.
//       * or a collective of the same group goes over MPI (a host value): Backend::flush;
//     A flush launches every send/recv collected so far, batched or not, as one group.
// Each launched operation completes (Work::wait returns) when its done event has fired.
#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/background_thread.hpp"
#include "common/comm/op.hpp"
#include "common/errors.hpp"

namespace scalelab::comm {

bool nccl_compiled() { return true; }

int nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return v;
}

namespace detail {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CheckFailed(fmt::format("nccl backend: {}: {}", what, cudaGetErrorString(e)));
}

// NCCL's own words for its last failure ("Duplicate GPU detected ...", a peer's mismatch),
// which ncclGetErrorString's few words ("invalid usage") leave out. (Its argument is unused.)
std::string nccl_detail() {
  const char* last = ncclGetLastError(nullptr);
  return last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : std::string();
}

void check_nccl(ncclResult_t r, const Op& op, const char* call) {
  if (r != ncclSuccess)
    throw CheckFailed(fmt::format("{}: {} failed: {}{}", op.label(), call, ncclGetErrorString(r),
                                  nccl_detail()));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::bf16: return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

void* ptr(const Tensor& t) { return t.defined() ? const_cast<void*>(t.data_ptr()) : nullptr; }

// byte offset `elements` into a tensor's memory
void* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(ptr(t)) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(int rank, int size, const std::function<void(void*, std::size_t)>& broadcast_id)
      : rank_(rank), size_(size) {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    ncclUniqueId id;
    if (rank_ == 0 && ncclGetUniqueId(&id) != ncclSuccess)
      throw CheckFailed("nccl backend: ncclGetUniqueId failed");
    broadcast_id(&id, sizeof(id));
    ncclResult_t r = ncclCommInitRank(&comm_, size_, id, rank_);
    if (r != ncclSuccess)
      throw CheckFailed(fmt::format(
          "nccl backend: ncclCommInitRank (rank {} of {}, device {}): {}{}", rank_, size_,
          device_, ncclGetErrorString(r), nccl_detail()));
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    worker_ = std::thread([this] { run(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // After an asynchronous error NCCL's kernels may never finish: abort (which does not wait
    // for them) instead of destroy (which does).
    if (failed_) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  void submit(std::shared_ptr<Op> op) override {
    // The point in the caller's stream the operation must wait for.
    cudaEvent_t ready = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready, 0), "cudaEventRecord");
    if (is_point_to_point(op->kind)) {
      // Waiting on a send/recv, or the end of its batch (send_recv_async), launches the group it
      // belongs to.
      op->flush = [this] { flush(); };
    }
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(Item{std::move(op), ready, nullptr});
    }
    cv_.notify_all();
  }

  void flush() override {
    std::lock_guard lock(mutex_);
    flush_ = true;
    cv_.notify_all();
  }

 private:
  struct Item {
    std::shared_ptr<Op> op;
    cudaEvent_t ready, done;
  };

  void run() {
    mark_background_thread();  // NCCL's and this queue's memory is not the rank's own
    cudaSetDevice(device_);
    std::vector<Item> p2p;  // send/recvs waiting to be launched as one group
    while (true) {
      std::deque<Item> work;
      bool flush = false, stop = false;
      {
        std::unique_lock lock(mutex_);
        auto ready = [&] { return stop_ || !queue_.empty() || flush_; };
        if (pending_.empty()) cv_.wait(lock, ready);
        work.swap(queue_);
        flush = flush_;
        flush_ = false;
        stop = stop_;
      }
      for (auto& item : work) {
        if (is_point_to_point(item.op->kind)) {
          p2p.push_back(item);
        } else {
          launch_group(p2p);  // earlier send/recvs first, in order
          launch({item});
        }
      }
      if (flush || stop) launch_group(p2p);
      poll();
      if (stop && pending_.empty() && p2p.empty()) {
        std::lock_guard lock(mutex_);
        if (queue_.empty()) return;
      }
      if (!pending_.empty()) std::this_thread::yield();
    }
  }

  void launch_group(std::vector<Item>& items) {
    if (items.empty()) return;
    launch(items);
    items.clear();
  }

  // Launches `items` (one collective, or a group of send/recvs) on the comm stream. On failure
  // every item completes with the error, once, and nothing of them stays pending.
  void launch(const std::vector<Item>& items) {
    std::vector<cudaEvent_t> done;  // one per item, recorded after the group
    try {
      for (auto& item : items)
        check_cuda(cudaStreamWaitEvent(stream_, item.ready, 0), "cudaStreamWaitEvent");
      check_nccl(ncclGroupStart(), *items.front().op, "ncclGroupStart");
      try {
        for (auto& item : items) call(*item.op);
      } catch (...) {
        // NCCL counts open groups per thread: left open, every later call of this worker would
        // land in a group that never launches, and "complete" having moved nothing.
        ncclGroupEnd();
        throw;
      }
      check_nccl(ncclGroupEnd(), *items.front().op, "ncclGroupEnd");
      for (std::size_t i = 0; i < items.size(); ++i) {
        cudaEvent_t e = nullptr;
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
        done.push_back(e);
        check_cuda(cudaEventRecord(e, stream_), "cudaEventRecord");
      }
    } catch (...) {
      for (cudaEvent_t e : done) cudaEventDestroy(e);
      for (auto& item : items) {
        cudaEventDestroy(item.ready);
        item.op->complete(std::current_exception());
      }
      return;
    }
    for (std::size_t i = 0; i < items.size(); ++i)
      pending_.push_back(Item{items[i].op, items[i].ready, done[i]});
  }

  void call(Op& op) {
    const int64_t n_out = op.out.defined() ? op.out.numel() : 0;
    const int64_t n_in = op.in.defined() ? op.in.numel() : 0;
    switch (op.kind) {
      case OpKind::all_reduce:
        check_nccl(ncclAllReduce(ptr(op.out), ptr(op.out), n_out, nccl_type(op.out.dtype()),
                                 nccl_op(op.reduce), comm_, stream_), op, "ncclAllReduce");
        return;
      case OpKind::reduce:
        check_nccl(ncclReduce(ptr(op.out), ptr(op.out), n_out, nccl_type(op.out.dtype()),
                              nccl_op(op.reduce), op.root, comm_, stream_), op, "ncclReduce");
        return;
      case OpKind::broadcast:
        check_nccl(ncclBroadcast(ptr(op.out), ptr(op.out), n_out, nccl_type(op.out.dtype()),
                                 op.root, comm_, stream_), op, "ncclBroadcast");
        return;
      case OpKind::all_gather:
        check_nccl(ncclAllGather(ptr(op.in), ptr(op.out), n_in, nccl_type(op.in.dtype()), comm_,
                                 stream_), op, "ncclAllGather");
        return;
      case OpKind::reduce_scatter:
        check_nccl(ncclReduceScatter(ptr(op.in), ptr(op.out), n_out, nccl_type(op.out.dtype()),
                                     nccl_op(op.reduce), comm_, stream_), op, "ncclReduceScatter");
        return;
      case OpKind::scatter:  // root sends chunk r to rank r (itself included), inside the group
        if (rank_ == op.root)
          for (int r = 0; r < size_; ++r)
            check_nccl(ncclSend(at(op.in, r * n_out), n_out, nccl_type(op.out.dtype()), r, comm_,
                                stream_), op, "ncclSend");
        check_nccl(ncclRecv(ptr(op.out), n_out, nccl_type(op.out.dtype()), op.root, comm_, stream_),
                   op, "ncclRecv");
        return;
      case OpKind::gather:
        check_nccl(ncclSend(ptr(op.in), n_in, nccl_type(op.in.dtype()), op.root, comm_, stream_),
                   op, "ncclSend");
        if (rank_ == op.root)
          for (int r = 0; r < size_; ++r)
            check_nccl(ncclRecv(at(op.out, r * n_in), n_in, nccl_type(op.in.dtype()), r, comm_,
                                stream_), op, "ncclRecv");
        return;
      case OpKind::all_to_all:  // chunk r to rank r and chunk r from rank r, inside the group
        if (!op.send_counts.empty()) {  // per-peer counts: consecutive chunks of their sizes
          int64_t s_at = 0, r_at = 0;
          for (int r = 0; r < size_; ++r) {
            check_nccl(ncclSend(at(op.in, s_at), op.send_counts[r], nccl_type(op.in.dtype()), r,
                                comm_, stream_), op, "ncclSend");
            check_nccl(ncclRecv(at(op.out, r_at), op.recv_counts[r], nccl_type(op.in.dtype()), r,
                                comm_, stream_), op, "ncclRecv");
            s_at += op.send_counts[r];
            r_at += op.recv_counts[r];
          }
          return;
        }
        for (int r = 0; r < size_; ++r) {
          const int64_t chunk = n_in / size_;
          check_nccl(ncclSend(at(op.in, r * chunk), chunk, nccl_type(op.in.dtype()), r, comm_,
                              stream_), op, "ncclSend");
          check_nccl(ncclRecv(at(op.out, r * chunk), chunk, nccl_type(op.in.dtype()), r, comm_,
                              stream_), op, "ncclRecv");
        }
        return;
      case OpKind::send:
        check_nccl(ncclSend(ptr(op.in), n_in, nccl_type(op.in.dtype()), op.peer, comm_, stream_),
                   op, "ncclSend");
        return;
      case OpKind::recv:
        check_nccl(ncclRecv(ptr(op.out), n_out, nccl_type(op.out.dtype()), op.peer, comm_, stream_),
                   op, "ncclRecv");
        return;
      case OpKind::barrier:
      case OpKind::split:
        break;  // run on the mpi backend (communicator.cpp)
    }
    throw CheckFailed(fmt::format("{}: not an NCCL operation", op.label()));
  }

  // Completes, in order, the launched operations whose done event has fired.
  void poll() {
    while (!pending_.empty()) {
      Item& item = pending_.front();
      cudaError_t e = cudaEventQuery(item.done);
      std::string why;
      if (e == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        if (async == ncclSuccess || async == ncclInProgress) return;
        failed_ = true;  // the communicator is done for: abort it at the end
        why = fmt::format("{}{}", ncclGetErrorString(async), nccl_detail());
      } else if (e != cudaSuccess) {
        why = cudaGetErrorString(e);
      }
      Item done = item;
      pending_.pop_front();
      cudaEventDestroy(done.ready);
      cudaEventDestroy(done.done);
      if (why.empty()) {
        done.op->complete();
      } else {
        done.op->complete(std::make_exception_ptr(CheckFailed(
            fmt::format("{}: the NCCL operation failed: {}", done.op->label(), why))));
      }
    }
  }

  int rank_, size_, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> pending_;  // worker only
  bool stop_ = false, flush_ = false;
  bool failed_ = false;  // an asynchronous NCCL error was seen (worker only; read after join)
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(int rank, int size,
                                           const std::function<void(void*, std::size_t)>& broadcast_id) {
  return std::make_unique<NcclBackend>(rank, size, broadcast_id);
}

}  // namespace detail
}  // namespace scalelab::comm
