// The mpi backend: one worker thread per communicator issues every MPI call of that
// communicator, in submission order.
//
// Why one thread: MPI requires the collectives of one communicator to be called in the same
// order on every rank. Submitting from the caller's thread and executing on one queue keeps that
// order, and lets a non-blocking collective progress (the worker sits in MPI) while the caller
// computes. Collectives run as blocking MPI calls on the worker; send/recv are posted as
// MPI_Isend/MPI_Irecv and completed by polling, so a recv posted before a send never blocks the
// send behind it (the ring pattern: recv_async, send, wait).
//
// CUDA tensors are staged: copied to host before the MPI call, and back after it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/background_thread.hpp"
#include "common/comm/op.hpp"
#include "common/errors.hpp"
#include "common/runtime.hpp"

namespace scalelab::comm::detail {
namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT;
    // MPI has no bf16: moved as 16-bit words, reduced by our own MPI_Ops (bf16_op below).
    case DType::bf16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// A receive whose message is not the size of its buffer: both sizes in bytes and in the buffer's
// dtype, and the dtype whose elements the message's bytes would make (the sender's tensor of the
// same shape in another dtype: "16384 bf16 elements" where f32 was expected).
std::string size_mismatch(const std::string& label, const MPI_Status& status, int peer,
                          const Tensor& out) {
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  const auto bytes = static_cast<std::size_t>(got);
  const DType want = out.dtype();
  const std::size_t size = dtype_size(want);
  const std::string as_elements =
      bytes % size == 0 ? fmt::format("{} {} elements", bytes / size, dtype_name(want))
                        : fmt::format("not a whole number of {} elements", dtype_name(want));
  std::string text = fmt::format("{}: received {} bytes from rank {} ({}), expected {} {} "
                                 "elements ({} bytes)", label, bytes, peer, as_elements,
                                 out.numel(), dtype_name(want), out.nbytes());
  for (DType other : {DType::f32, DType::f64, DType::i32, DType::bf16})
    if (other != want && static_cast<std::size_t>(out.numel()) * dtype_size(other) == bytes)
      return text + fmt::format(": the bytes of {} {} elements, the same count in another "
                                "dtype (do the sender's and the receiver's dtypes differ?)",
                                out.numel(), dtype_name(other));
  return text;
}

// bf16 reductions: MPI knows no bf16, so sum/max/min are user-defined MPI_Ops over the 16-bit
// words. Each combines two bf16 vectors in float and rounds once per combine, as NCCL's bf16
// all-reduce does, so a sum over n ranks rounds n - 1 times (relative error up to ~(n-1) 2^-8).
// Fine for activations (tensor parallel's partial sums, already bf16); the GRADIENT all-reduce
// stays fp32 (gradients are fp32 in mixed precision; see docs/architecture.md, "Precision").
template <class F>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16(F{}(float(a[i]), float(b[i])));
}
struct FloatMax {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct FloatMin {
  float operator()(float a, float b) const { return std::min(a, b); }
};

MPI_Op bf16_op(ReduceOp op) {
  static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] {  // after MPI_Init: the first bf16 reduction; MPI frees them at exit
    MPI_Op_create(&bf16_combine<std::plus<float>>, /*commute=*/1, &sum);
    MPI_Op_create(&bf16_combine<FloatMax>, 1, &max);
    MPI_Op_create(&bf16_combine<FloatMin>, 1, &min);
  });
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return sum;
    case ReduceOp::max: return max;
    case ReduceOp::min: return min;
  }
  return MPI_OP_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16) return bf16_op(op);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;  // avg = sum, then divided by the group size
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

void check_mpi(int code, const Op& op, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw CheckFailed(fmt::format("{}: {} failed: {}", op.label(), call, std::string(text, len)));
}

int count_of(const Tensor& t) {
  SCALELAB_CHECK(t.numel() <= INT32_MAX, "a message of {} elements is too large for MPI",
                 t.numel());
  return static_cast<int>(t.numel());
}

// A host tensor to hand to MPI: `t` itself, or a staged host copy of a device tensor (CUDA, or
// the simulated GPU, whose memory is closed to host code as a GPU's is).
// Staging is this backend's, not the caller's: not counted in host_device_copies().
Tensor host_view(const Tensor& t, bool copy_in) {
  if (!t.defined() || t.device().is_cpu()) return t;
  const HostDeviceCopiesUncounted staging;
  return copy_in ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype(), Device::cpu());
}

void copy_back(const Tensor& device_t, const Tensor& host_t) {
  if (!device_t.defined() || device_t.device().is_cpu()) return;
  const HostDeviceCopiesUncounted staging;
  Tensor d = device_t;  // a handle: writes go to the caller's memory
  d.copy_from(host_t);
}

void divide(Tensor& t, int n) {
  if (n == 1 || t.numel() == 0) return;
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<float>(n);
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= n;
  } else if (t.dtype() == DType::bf16) {
    bf16* p = t.data<bf16>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16(float(p[i]) / static_cast<float>(n));
  }
}

// What every rank says about the collective it is in, for the matching check.
struct Signature {
  long long kind, count, dtype, root, op;
};

class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    worker_ = std::thread([this] { run(); });
  }

  ~MpiBackend() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  void submit(std::shared_ptr<Op> op) override {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

 private:
  struct Pending {
    MPI_Request request;
    std::shared_ptr<Op> op;
    Tensor host;  // the staged buffer (send: keeps it alive; recv: copied back on completion)
  };

  void run() {
    mark_background_thread();  // MPI's buffers and this queue are not the rank's own memory
    int idle_polls = 0;
    while (true) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock lock(mutex_);
        if (pending_.empty())
          cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (!queue_.empty()) {
          op = std::move(queue_.front());
          queue_.pop_front();
        } else if (stop_ && pending_.empty()) {
          return;
        }
      }
      bool progressed = false;
      {
        const BackgroundMpiCalls mpi;  // exit_all finalizes MPI only between these
        if (!mpi.open()) return;       // it is finalizing: no MPI call from here on
        if (op) execute(op);
        if (!pending_.empty()) progressed = poll();
      }
      if (op || progressed) {
        idle_polls = 0;
      } else if (!pending_.empty()) {
        // Nothing new and nothing finished: let other ranks (oversubscribed cores) run.
        if (++idle_polls < 1000)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // Completes the posted send/recvs that are done. True if any was.
  bool poll() {
    bool any = false;
    for (std::size_t i = 0; i < pending_.size();) {
      int done = 0;
      MPI_Status status;
      int code = MPI_Test(&pending_[i].request, &done, &status);
      if (code != MPI_SUCCESS || !done) {
        if (code != MPI_SUCCESS) {
          std::shared_ptr<Op> op = std::move(pending_[i].op);
          pending_.erase(pending_.begin() + static_cast<long>(i));  // its buffer too
          fail(op, code, "MPI_Test");
          any = true;
          continue;
        }
        ++i;
        continue;
      }
      Pending p = std::move(pending_[i]);
      pending_.erase(pending_.begin() + static_cast<long>(i));
      any = true;
      try {
        if (p.op->kind == OpKind::recv) {
          int got = 0;
          MPI_Get_count(&status, mpi_type(p.op->out.dtype()), &got);
          if (got != p.op->out.numel())
            throw CheckFailed(size_mismatch(p.op->label(), status, p.op->peer, p.op->out));
          copy_back(p.op->out, p.host);
        }
        p.host = Tensor();  // the message's buffer is released before the op is seen done
        p.op->complete();
      } catch (...) {
        p.host = Tensor();
        p.op->complete(std::current_exception());
      }
    }
    return any;
  }

  void fail(const std::shared_ptr<Op>& op, int code, const char* call) {
    try {
      check_mpi(code, *op, call);
    } catch (...) {
      op->complete(std::current_exception());
    }
  }

  void execute(const std::shared_ptr<Op>& op) {
    try {
      if (is_point_to_point(op->kind)) {
        post(op);
        return;
      }
      if (check_matching() && op->kind != OpKind::split) check_signatures(*op);
      run_collective(*op);
      op->complete();
    } catch (...) {
      op->complete(std::current_exception());
    }
  }

  void post(const std::shared_ptr<Op>& op) {
    Pending p{MPI_REQUEST_NULL, op, {}};
    if (op->kind == OpKind::send) {
      p.host = host_view(op->in, true);
      check_mpi(MPI_Isend(p.host.data_ptr(), count_of(p.host), mpi_type(p.host.dtype()), op->peer,
                          op->tag, comm_, &p.request),
                *op, "MPI_Isend");
    } else {
      p.host = host_view(op->out, false);
      check_mpi(MPI_Irecv(p.host.data_ptr(), count_of(p.host), mpi_type(p.host.dtype()), op->peer,
                          op->tag, comm_, &p.request),
                *op, "MPI_Irecv");
    }
    pending_.push_back(std::move(p));
  }

  // Every rank contributes (kind, count, dtype, root, op); all must agree. Every rank sees the
  // same table, so every rank throws the same error and none is left waiting.
  void check_signatures(const Op& op) {
    const Tensor& t = op.kind == OpKind::reduce_scatter || op.kind == OpKind::gather
                          ? op.in
                          : op.out;  // the per-rank element count that must match
    const bool variable = op.kind == OpKind::all_to_all && !op.send_counts.empty();
    Signature mine{static_cast<long long>(op.kind),
                   variable ? -2 : t.defined() ? t.numel() : 0,  // -2: per-peer counts
                   t.defined() ? static_cast<long long>(t.dtype()) : -1, op.root,
                   static_cast<long long>(op.reduce)};
    std::vector<Signature> all(static_cast<std::size_t>(size_));
    check_mpi(MPI_Allgather(&mine, 5, MPI_LONG_LONG, all.data(), 5, MPI_LONG_LONG, comm_), op,
              "MPI_Allgather (matching check)");
    bool same = true;
    for (auto& s : all)
      same = same && s.kind == mine.kind && s.count == all[0].count && s.dtype == all[0].dtype &&
             s.root == all[0].root && s.op == all[0].op;
    for (auto& s : all) same = same && s.kind == all[0].kind;
    if (same && variable) {
      check_counts(op);
      return;
    }
    if (same) return;
    std::string table;
    for (int r = 0; r < size_; ++r) {
      const Signature& s = all[static_cast<std::size_t>(r)];
      table += fmt::format("{}rank {}: {} of {} {}", r ? ", " : "", r,
                           op_kind_name(static_cast<OpKind>(s.kind)), s.count,
                           s.dtype < 0 ? "-" : dtype_name(static_cast<DType>(s.dtype)));
      if (s.kind == static_cast<long long>(OpKind::reduce) ||
          s.kind == static_cast<long long>(OpKind::broadcast) ||
          s.kind == static_cast<long long>(OpKind::scatter) ||
          s.kind == static_cast<long long>(OpKind::gather))
        table += fmt::format(" root {}", s.root);
      if (s.kind == static_cast<long long>(OpKind::all_reduce) ||
          s.kind == static_cast<long long>(OpKind::reduce) ||
          s.kind == static_cast<long long>(OpKind::reduce_scatter))
        table += fmt::format(" {}", reduce_op_name(static_cast<ReduceOp>(s.op)));
    }
    throw CheckFailed(fmt::format("{}: ranks disagree on the collective: {}", op.label(), table));
  }

  // all_to_all with counts: what I send rank r must be what r expects from me. The counts go
  // round once (an MPI_Alltoall), and every rank learns whether any rank found a mismatch, so
  // every rank throws alike.
  void check_counts(const Op& op) {
    std::vector<long long> out(op.send_counts.begin(), op.send_counts.end()), in(size_);
    check_mpi(MPI_Alltoall(out.data(), 1, MPI_LONG_LONG, in.data(), 1, MPI_LONG_LONG, comm_), op,
              "MPI_Alltoall (matching check)");
    long long bad = -1;  // the first source whose count disagrees with mine
    for (int s = 0; s < size_ && bad < 0; ++s)
      if (in[s] != op.recv_counts[s]) bad = s;
    std::vector<long long> all(size_);
    check_mpi(MPI_Allgather(&bad, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, comm_), op,
              "MPI_Allgather (matching check)");
    for (int r = 0; r < size_; ++r)
      if (all[r] >= 0)
        throw CheckFailed(fmt::format("{}: ranks disagree on the counts: rank {}'s receive count "
                                      "from rank {} is not what rank {} sends it", op.label(), r,
                                      all[r], all[r]));
  }

  void run_collective(Op& op) {
    switch (op.kind) {
      case OpKind::barrier:
        check_mpi(MPI_Barrier(comm_), op, "MPI_Barrier");
        return;
      case OpKind::split: {
        MPI_Comm c = MPI_COMM_NULL;
        check_mpi(MPI_Comm_split(comm_, op.color, op.key, &c), op, "MPI_Comm_split");
        op.split_comm = c;
        return;
      }
      case OpKind::all_reduce:
      case OpKind::reduce:
      case OpKind::broadcast: {
        const bool root_only_result = op.kind == OpKind::reduce;
        Tensor h = host_view(op.out, true);
        const int n = count_of(h);
        const MPI_Datatype type = mpi_type(h.dtype());
        if (op.kind == OpKind::all_reduce) {
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, h.data_ptr(), n, type,
                                  mpi_op(op.reduce, h.dtype()), comm_),
                    op, "MPI_Allreduce");
        } else if (op.kind == OpKind::reduce) {
          void* send = rank_ == op.root ? MPI_IN_PLACE : h.data_ptr();
          void* recv = rank_ == op.root ? h.data_ptr() : nullptr;
          check_mpi(MPI_Reduce(send, recv, n, type, mpi_op(op.reduce, h.dtype()), op.root, comm_),
                    op, "MPI_Reduce");
        } else {
          check_mpi(MPI_Bcast(h.data_ptr(), n, type, op.root, comm_), op, "MPI_Bcast");
        }
        if (op.reduce == ReduceOp::avg && (op.kind != OpKind::broadcast) &&
            (!root_only_result || rank_ == op.root))
          divide(h, size_);
        copy_back(op.out, h);
        return;
      }
      case OpKind::all_gather: {
        Tensor in = host_view(op.in, true), out = host_view(op.out, false);
        check_mpi(MPI_Allgather(in.data_ptr(), count_of(in), mpi_type(in.dtype()), out.data_ptr(),
                                count_of(in), mpi_type(in.dtype()), comm_),
                  op, "MPI_Allgather");
        copy_back(op.out, out);
        return;
      }
      case OpKind::all_to_all: {
        Tensor in = host_view(op.in, true), out = host_view(op.out, false);
        if (!op.send_counts.empty()) {  // per-peer counts: MPI_Alltoallv
          std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
          int64_t s_at = 0, r_at = 0;
          for (int r = 0; r < size_; ++r) {
            SCALELAB_CHECK(s_at + op.send_counts[r] <= INT32_MAX &&
                               r_at + op.recv_counts[r] <= INT32_MAX,
                           "{}: counts too large for MPI", op.label());
            sc[r] = static_cast<int>(op.send_counts[r]);
            sd[r] = static_cast<int>(s_at);
            rc[r] = static_cast<int>(op.recv_counts[r]);
            rd[r] = static_cast<int>(r_at);
            s_at += op.send_counts[r];
            r_at += op.recv_counts[r];
          }
          check_mpi(MPI_Alltoallv(in.data_ptr(), sc.data(), sd.data(), mpi_type(in.dtype()),
                                  out.data_ptr(), rc.data(), rd.data(), mpi_type(in.dtype()),
                                  comm_),
                    op, "MPI_Alltoallv");
          copy_back(op.out, out);
          return;
        }
        const int chunk = static_cast<int>(in.numel() / size_);
        check_mpi(MPI_Alltoall(in.data_ptr(), chunk, mpi_type(in.dtype()), out.data_ptr(), chunk,
                               mpi_type(in.dtype()), comm_),
                  op, "MPI_Alltoall");
        copy_back(op.out, out);
        return;
      }
      case OpKind::reduce_scatter: {
        Tensor in = host_view(op.in, true), out = host_view(op.out, false);
        check_mpi(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), count_of(out),
                                           mpi_type(out.dtype()), mpi_op(op.reduce, out.dtype()),
                                           comm_),
                  op, "MPI_Reduce_scatter_block");
        if (op.reduce == ReduceOp::avg) divide(out, size_);
        copy_back(op.out, out);
        return;
      }
      case OpKind::scatter: {
        const bool root = rank_ == op.root;
        Tensor in = root ? host_view(op.in, true) : Tensor();
        Tensor out = host_view(op.out, false);
        check_mpi(MPI_Scatter(root ? in.data_ptr() : nullptr, count_of(out), mpi_type(out.dtype()),
                              out.data_ptr(), count_of(out), mpi_type(out.dtype()), op.root, comm_),
                  op, "MPI_Scatter");
        copy_back(op.out, out);
        return;
      }
      case OpKind::gather: {
        const bool root = rank_ == op.root;
        Tensor in = host_view(op.in, true);
        Tensor out = root ? host_view(op.out, false) : Tensor();
        check_mpi(MPI_Gather(in.data_ptr(), count_of(in), mpi_type(in.dtype()),
                             root ? out.data_ptr() : nullptr, count_of(in), mpi_type(in.dtype()),
                             op.root, comm_),
                  op, "MPI_Gather");
        if (root) copy_back(op.out, out);
        return;
      }
      case OpKind::send:
      case OpKind::recv:
        break;  // posted, not run (see post())
    }
    throw CheckFailed(fmt::format("{}: not a collective", op.label()));
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  std::vector<Pending> pending_;  // touched by the worker only
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm) {
  return std::make_unique<MpiBackend>(comm);
}

}  // namespace scalelab::comm::detail
