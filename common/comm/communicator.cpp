// The Communicator front end: argument checks, sequence numbers, watchdog registration and
// trace events; the backends (backend_*.cpp) only move bytes.
#include "common/comm/communicator.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/comm/gpu_sharing.hpp"
#include "common/comm/op.hpp"
#include "common/comm/route.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/exec_log.hpp"
#include "common/log.hpp"
#include "common/runtime.hpp"
#include "common/trace.hpp"
#include "common/watchdog.hpp"

namespace scalelab::comm {

namespace detail {

struct CommState {
  std::string name, backend;  // backend: auto | mpi | nccl | self
  int rank = 0, size = 1;
  std::vector<int> world_ranks;
  int watchdog_group = 0;
  std::atomic<std::int64_t> coll_seq{0}, p2p_seq{0};
  std::unique_ptr<Backend> nccl;  // made on the first CUDA operation (declared first: freed last)
  std::unique_ptr<Backend> mpi;   // mpi, nccl, auto: the group's MPI communicator
  // self: every operation; nccl and auto: made for the first message to oneself (a copy)
  std::unique_ptr<Backend> self;
  std::mutex lazy_mutex;  // guards making nccl and self on first use
  // nccl and auto with NCCL built in: the GPU of every world rank (gpu_sharing.hpp), shared by
  // the world and its splits; and whether NCCL refuses this group's members (two on one GPU).
  std::shared_ptr<const std::vector<GpuSlot>> gpu_slots;
  bool nccl_refused = false;
  std::string shared_text;  // "ranks 0,1 share GPU 0 of node a" when refused

  ~CommState() {
    nccl.reset();  // NCCL before the MPI communicator it was bootstrapped over
    mpi.reset();
  }
};

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce: return "reduce";
    case OpKind::broadcast: return "broadcast";
    case OpKind::all_gather: return "all_gather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::scatter: return "scatter";
    case OpKind::gather: return "gather";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::split: return "split";
    case OpKind::all_to_all: return "all_to_all";
  }
  return "?";
}

std::string Op::label() const {
  return fmt::format("{} #{} (group {})", op_kind_name(kind), seq, group);
}

void Op::complete(std::exception_ptr error) {
  // Drop the tensors before anyone can see the op done: a finished operation must pin no memory,
  // or the allocator's counters read after wait() would still include a buffer the caller
  // released (and it would be freed later, on the worker thread, mid-measurement).
  in = Tensor();
  out = Tensor();
  if (watchdog_token) watchdog::leave(watchdog_token);
  if (trace_begin_us >= 0) {
    trace::event(op_kind_name(kind), "comm", trace_begin_us, trace::now_us(),
                 trace::kComm + trace_lane,
                 fmt::format("\"bytes\":{},\"group\":\"{}\",\"seq\":{},\"transport\":\"{}\"",
                             bytes, group, seq, transport));
    trace::release_comm_lane(trace_lane);
  }
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

void Op::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Op::test() {
  std::lock_guard lock(mutex_);
  return done_;
}

}  // namespace detail

using detail::Backend;
using detail::Op;
using detail::OpKind;

namespace {

std::atomic<bool> g_check{[] {
  const char* v = std::getenv("SCALELAB_COMM_CHECK");
  return v && std::strcmp(v, "0") != 0 && *v;
}()};

void check_tensor(const Tensor& t, OpKind kind, const char* role) {
  SCALELAB_CHECK(t.defined(), "{}: the {} tensor is undefined", detail::op_kind_name(kind), role);
  SCALELAB_CHECK(t.is_contiguous(), "{}: the {} tensor {} is not contiguous",
                 detail::op_kind_name(kind), role, t.str());
}

std::shared_ptr<Op> make_op(OpKind kind) {
  auto op = std::make_shared<Op>();
  op->kind = kind;
  return op;
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

void set_check_matching(bool on) { g_check = on; }
bool check_matching() { return g_check; }

namespace {
std::atomic<std::int64_t> g_waited_ns{0};  // wait_seconds()

// set_overlap(false): the operations submitted since the last compute kernel, waited for
// before the next one (exec_log's compute hook).
std::atomic<bool> g_overlap{true};
std::mutex g_unwaited_mutex;
std::vector<Work> g_unwaited;
}  // namespace

double wait_seconds() { return static_cast<double>(g_waited_ns.load()) * 1e-9; }

void set_overlap(bool on) {
  g_overlap = on;
  if (on) {
    exec_log::set_compute_hook({});
    std::lock_guard lock(g_unwaited_mutex);
    g_unwaited.clear();
  } else {
    exec_log::set_compute_hook([] {
      std::vector<Work> works;
      {
        std::lock_guard lock(g_unwaited_mutex);
        works.swap(g_unwaited);
      }
      wait_all(works);
    });
  }
}
bool overlap() { return g_overlap; }

void Work::wait() {
  if (!op_) return;
  // What the caller waits for, in the execution log (in order with the compute it overlapped)
  // and in the trace: a span on the compute track from the call to the return, the exposed
  // part of the operation (its own span on a comm track runs from submission to completion).
  exec_log::record_wait(detail::op_kind_name(op_->kind), op_->group, op_->world_peer, op_->tag,
                        op_->seq, op_->transport);
  const auto t0 = std::chrono::steady_clock::now();
  const double trace_t0 = trace::enabled() ? trace::now_us() : -1;
  if (op_->flush) op_->flush();
  op_->wait();
  g_waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0).count();
  if (trace_t0 >= 0)
    trace::event(fmt::format("wait {}", detail::op_kind_name(op_->kind)), "comm wait", trace_t0,
                 trace::now_us(), trace::kCompute,
                 fmt::format("\"group\":\"{}\",\"seq\":{}", op_->group, op_->seq));
}

bool Work::test() {
  if (!op_) return true;
  if (op_->flush) op_->flush();
  return op_->test();
}

void wait_all(std::vector<Work>& works) {
  for (auto& w : works) w.wait();
}

// ---- construction ------------------------------------------------------------------------------

namespace {

// Every rank's `text`, cut to `width` - 1 characters, over `world` (collective).
std::vector<std::string> all_gather_text(const std::string& text, int width, MPI_Comm world) {
  int n = 1;
  MPI_Comm_size(world, &n);
  std::vector<char> mine(width, '\0'), all(static_cast<std::size_t>(width) * n);
  text.copy(mine.data(), width - 1);
  MPI_Allgather(mine.data(), width, MPI_CHAR, all.data(), width, MPI_CHAR, world);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.emplace_back(&all[static_cast<std::size_t>(width) * r]);
  return out;
}

// Which GPU of which node every world rank computes on: local rank % GPUs, the rule of
// train::rank_device and lab 00, and that GPU's UUID (which physical GPU it is, whatever the
// process calls it). Collective over `world` (a duplicate of MPI_COMM_WORLD).
std::shared_ptr<const std::vector<detail::GpuSlot>> gather_gpu_slots(MPI_Comm world) {
  int me = 0, n = 1;
  MPI_Comm_rank(world, &me);
  MPI_Comm_size(world, &n);
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node);
  int local = 0, leader = me;
  MPI_Comm_rank(node, &local);
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  const int gpus = cuda_device_count();
  const int gpu = gpus > 0 ? local % gpus : -1;
  const int mine[2] = {leader, gpu};
  std::vector<int> all(2 * static_cast<std::size_t>(n));
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, world);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  const std::vector<std::string> hosts = all_gather_text(host, 64, world);
  const std::vector<std::string> uuids = all_gather_text(cuda_device_uuid(gpu), 48, world);
  auto slots = std::make_shared<std::vector<detail::GpuSlot>>(n);
  for (int r = 0; r < n; ++r) (*slots)[r] = {all[2 * r], all[2 * r + 1], hosts[r], uuids[r]};
  return slots;
}

// Whether NCCL takes this group's members, from the world's table (every member computes the
// same answer).
void judge_gpu_sharing(detail::CommState& s) {
  if (!s.gpu_slots) return;
  const detail::SharedGpus shared = detail::shared_gpus(*s.gpu_slots, s.world_ranks);
  const char* env = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  s.nccl_refused = !detail::nccl_accepts(shared.most, nccl_version(), env ? env : "");
  s.shared_text = s.nccl_refused ? shared.text : std::string();
}

}  // namespace

Communicator Communicator::world(const std::string& backend) {
  SCALELAB_REQUIRE(backend == "auto" || backend == "mpi" || backend == "nccl" || backend == "self",
                   "backend must be auto, mpi, nccl or self, got '{}'", backend);
  SCALELAB_REQUIRE(backend != "nccl" || nccl_compiled(),
                   "backend nccl: this build has no NCCL (configure with CUDA and NCCL, or use "
                   "--backend mpi)");
  watchdog::start(watchdog::timeout());
  auto s = std::make_shared<detail::CommState>();
  s->name = "world";
  s->backend = backend;
  if (backend == "self") {
    s->rank = 0;
    s->size = 1;
    s->world_ranks = {world_rank()};
    s->self = detail::make_self_backend();
  } else {
    SCALELAB_CHECK(initialized(), "Communicator::world: MPI is not initialized (use run_main)");
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Comm_rank(dup, &s->rank);
    MPI_Comm_size(dup, &s->size);
    for (int r = 0; r < s->size; ++r) s->world_ranks.push_back(r);
    if ((backend == "nccl" || backend == "auto") && nccl_compiled()) {
      s->gpu_slots = gather_gpu_slots(dup);  // before the worker thread owns `dup`
      judge_gpu_sharing(*s);
    }
    s->mpi = detail::make_mpi_backend(dup);
    // Asked for NCCL on ranks it refuses: say so now, on every rank alike (the table is the
    // same everywhere), rather than fail in ncclCommInitRank at the first CUDA tensor.
    SCALELAB_REQUIRE(!(backend == "nccl" && s->nccl_refused), "--backend nccl: {}",
                     detail::sharing_refused_message({2, s->shared_text}, nccl_version()));
  }
  s->watchdog_group = watchdog::register_group(s->name, s->world_ranks);
  return Communicator(s);
}

int Communicator::rank() const { return s_ ? s_->rank : 0; }
int Communicator::size() const { return s_ ? s_->size : 0; }
const std::string& Communicator::name() const {
  static const std::string none = "(none)";
  return s_ ? s_->name : none;
}
const std::string& Communicator::backend() const {
  static const std::string none = "(none)";
  return s_ ? s_->backend : none;
}
const std::vector<int>& Communicator::world_ranks() const {
  static const std::vector<int> none;
  return s_ ? s_->world_ranks : none;
}

// ---- submission ------------------------------------------------------------------------------

namespace {

// The backend of `t` on group `s`, made on first use (NCCL's bootstrap is collective over the
// group: every member reaches it with the same operation).
Backend* backend_for(detail::CommState& s, detail::Transport t) {
  switch (t) {
    case detail::Transport::mpi: return s.mpi.get();
    case detail::Transport::self: {
      std::lock_guard lock(s.lazy_mutex);
      if (!s.self) s.self = detail::make_self_backend();
      return s.self.get();
    }
    case detail::Transport::nccl: break;
  }
  std::lock_guard lock(s.lazy_mutex);
  if (!s.nccl) {
    // The unique id travels over this group's MPI communicator, in order with its other work.
    Backend* mpi = s.mpi.get();
    s.nccl = detail::make_nccl_backend(s.rank, s.size, [mpi](void* id, std::size_t bytes) {
      Tensor buf = Tensor::zeros({static_cast<int64_t>((bytes + 3) / 4)}, DType::i32);
      std::memcpy(buf.data_ptr(), id, bytes);
      auto bcast = make_op(OpKind::broadcast);
      bcast->out = buf;
      bcast->root = 0;
      bcast->group = "nccl-bootstrap";
      mpi->submit(bcast);
      bcast->wait();
      std::memcpy(id, buf.data_ptr(), bytes);
    });
  }
  return s.nccl.get();
}

}  // namespace

Work Communicator::submit(std::shared_ptr<Op> op) const {
  SCALELAB_CHECK(s_ != nullptr, "{} on an empty Communicator (make one with Communicator::world)",
                 detail::op_kind_name(op->kind));
  detail::CommState& s = *s_;
  const bool p2p = is_point_to_point(op->kind);
  if (p2p)
    SCALELAB_CHECK(op->peer >= 0 && op->peer < s.size, "{}: peer rank {} is outside group {} of {} ranks",
                   detail::op_kind_name(op->kind), op->peer, s.name, s.size);
  if (op->kind == OpKind::reduce || op->kind == OpKind::broadcast || op->kind == OpKind::scatter ||
      op->kind == OpKind::gather)
    SCALELAB_CHECK(op->root >= 0 && op->root < s.size, "{}: root {} is outside group {} of {} ranks",
                   detail::op_kind_name(op->kind), op->root, s.name, s.size);
  for (const Tensor* t : {&op->in, &op->out}) {
    if (!t->defined()) continue;
    SCALELAB_CHECK(t->dtype() != DType::i32 || op->reduce != ReduceOp::avg,
                   "{}: avg of an i32 tensor", detail::op_kind_name(op->kind));
  }

  // Which transport moves this operation's bytes (route.hpp: the table and its test).
  const detail::Route route = detail::route(
      {s.backend, op->kind, detail::residence_of(*op), p2p && op->peer == s.rank, nccl_compiled(),
       s.nccl_refused});
  switch (route.error) {
    case detail::RouteError::none: break;
    case detail::RouteError::no_nccl:
      throw UsageError("backend nccl: this build has no NCCL (configure with CUDA and NCCL, or "
                       "use --backend mpi)");
    case detail::RouteError::gpu_shared:
      throw UsageError(fmt::format("--backend nccl: {}", detail::sharing_refused_message(
                                                             {2, s.shared_text}, nccl_version())));
    case detail::RouteError::mixed_devices:
      throw CheckFailed(fmt::format("{}: on the nccl backend both tensors live on the GPU; got {} "
                                    "and {}", detail::op_kind_name(op->kind), op->in.str(),
                                    op->out.str()));
  }
  if (route.staged_for_sharing) {
    static std::once_flag said;
    if (s.rank == 0)
      std::call_once(said, [&] {
        log::every_rank("note: {}, which NCCL {} refuses: --backend auto moves CUDA tensors "
                        "through MPI (staged in host memory) instead", s.shared_text,
                        detail::nccl_version_string(nccl_version()));
      });
  }
  Backend* target = backend_for(s, route.transport);
  op->transport = detail::transport_name(route.transport);
  if (!p2p && route.transport != detail::Transport::nccl) {
    // A collective after held send/recvs launches them first, whichever transport it takes.
    std::lock_guard lock(s.lazy_mutex);
    if (s.nccl) s.nccl->flush();
  }

  op->group = s.name;
  op->seq = p2p ? ++s.p2p_seq : ++s.coll_seq;
  // A peer or root is a rank of this group; the watchdog's report speaks of world ranks, so it
  // says both when they differ ("to rank 1 = world rank 3").
  const auto who = [&](int group_rank) {
    const int world = s.world_ranks[group_rank];
    return world == group_rank ? fmt::format("rank {}", group_rank)
                               : fmt::format("rank {} = world rank {}", group_rank, world);
  };
  std::string detail;
  if (op->kind == OpKind::send) detail = "to " + who(op->peer);
  if (op->kind == OpKind::recv) detail = "from " + who(op->peer);
  if (op->kind == OpKind::reduce || op->kind == OpKind::broadcast || op->kind == OpKind::scatter ||
      op->kind == OpKind::gather)
    detail = "root " + who(op->root);
  detail += (detail.empty() ? "over " : ", over ") + std::string(op->transport);
  op->watchdog_token = watchdog::enter(s.watchdog_group, detail::op_kind_name(op->kind), op->seq,
                                       op->bytes, !p2p, detail, p2p ? op->peer : -1);
  if (trace::enabled()) {
    op->trace_begin_us = trace::now_us();
    op->trace_lane = trace::acquire_comm_lane();  // overlapping operations: separate tracks
  }
  // Communication accounting: every operation the user submits, here and nowhere else (split is
  // structural, not traffic).
  if (op->kind != OpKind::split) {
    const bool reduction = op->kind == OpKind::all_reduce || op->kind == OpKind::reduce ||
                           op->kind == OpKind::reduce_scatter;
    const bool rooted = op->kind == OpKind::reduce || op->kind == OpKind::broadcast ||
                        op->kind == OpKind::scatter || op->kind == OpKind::gather;
    const int peer = p2p ? s.world_ranks[op->peer] : rooted ? s.world_ranks[op->root] : -1;
    op->world_peer = peer;
    detail::count_op(s.name, s.world_ranks, op->kind, reduction ? reduce_op_name(op->reduce) : "",
                     peer, op->bytes, op->transport);
    exec_log::record_comm(detail::op_kind_name(op->kind), s.name, peer, op->tag, op->bytes,
                          op->seq, op->transport);
  }
  target->submit(op);
  Work work(op);
  if (!g_overlap.load() && op->kind != OpKind::split) {
    std::lock_guard lock(g_unwaited_mutex);
    g_unwaited.push_back(work);
  }
  return work;
}

// ---- the operations ----------------------------------------------------------------------------

Work Communicator::all_reduce_async(const Tensor& t, ReduceOp rop) {
  auto op = make_op(OpKind::all_reduce);
  check_tensor(t, op->kind, "");
  op->out = t;
  op->reduce = rop;
  op->bytes = t.nbytes();
  return submit(op);
}
void Communicator::all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op).wait(); }

Work Communicator::reduce_async(const Tensor& t, int root, ReduceOp rop) {
  auto op = make_op(OpKind::reduce);
  check_tensor(t, op->kind, "");
  op->out = t;
  op->root = root;
  op->reduce = rop;
  op->bytes = t.nbytes();
  return submit(op);
}
void Communicator::reduce(const Tensor& t, int root, ReduceOp op) { reduce_async(t, root, op).wait(); }

Work Communicator::broadcast_async(const Tensor& t, int root) {
  auto op = make_op(OpKind::broadcast);
  check_tensor(t, op->kind, "");
  op->out = t;
  op->root = root;
  op->bytes = t.nbytes();
  return submit(op);
}
void Communicator::broadcast(const Tensor& t, int root) { broadcast_async(t, root).wait(); }

namespace {
// in (n elements) -> out (size * n elements), same dtype and device.
void check_gathered(const Tensor& small, const Tensor& big, int size, OpKind kind,
                    const char* small_role, const char* big_role) {
  check_tensor(small, kind, small_role);
  check_tensor(big, kind, big_role);
  SCALELAB_CHECK(small.dtype() == big.dtype(), "{}: dtypes differ ({} vs {})",
                 detail::op_kind_name(kind), small.str(), big.str());
  // NCCL reads and writes one GPU's memory: an output left on the host would not be written
  SCALELAB_CHECK(small.device() == big.device(),
                 "{}: the {} tensor {} and the {} tensor {} are on different devices: make both "
                 "on the device the collective runs on",
                 detail::op_kind_name(kind), small_role, small.str(), big_role, big.str());
  SCALELAB_CHECK(big.numel() == small.numel() * size,
                 "{}: the {} tensor {} must hold size ({}) x the {} tensor's {} elements",
                 detail::op_kind_name(kind), big_role, big.str(), size, small_role, small.numel());
}
}  // namespace

Work Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  auto op = make_op(OpKind::all_gather);
  check_gathered(in, out, size(), op->kind, "input", "output");
  op->in = in;
  op->out = out;
  op->bytes = out.nbytes();
  return submit(op);
}
void Communicator::all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out).wait(); }

Work Communicator::all_to_all_async(const Tensor& in, const Tensor& out) {
  auto op = make_op(OpKind::all_to_all);
  check_tensor(in, op->kind, "input");
  check_tensor(out, op->kind, "output");
  SCALELAB_CHECK(in.device() == out.device(),
                 "all_to_all: the input {} and output {} are on different devices", in.str(),
                 out.str());
  SCALELAB_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() &&
                     in.numel() % size() == 0,
                 "all_to_all: the input {} and output {} must be of one dtype and size, in {} "
                 "equal chunks", in.str(), out.str(), size());
  op->in = in;
  op->out = out;
  op->bytes = in.nbytes();
  return submit(op);
}
void Communicator::all_to_all(const Tensor& in, const Tensor& out) { all_to_all_async(in, out).wait(); }

Work Communicator::all_to_all_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                    const Tensor& out, const std::vector<int64_t>& recv_counts) {
  auto op = make_op(OpKind::all_to_all);
  check_tensor(in, op->kind, "input");
  check_tensor(out, op->kind, "output");
  const auto total = [&](const std::vector<int64_t>& counts, const char* what) {
    SCALELAB_CHECK(static_cast<int>(counts.size()) == size(),
                   "all_to_all: {} {} for a group of {} ranks", counts.size(), what, size());
    int64_t n = 0;
    for (int64_t c : counts) {
      SCALELAB_CHECK(c >= 0, "all_to_all: a negative count ({}) in the {}", c, what);
      n += c;
    }
    return n;
  };
  const int64_t sent = total(send_counts, "send counts");
  const int64_t received = total(recv_counts, "receive counts");
  SCALELAB_CHECK(in.dtype() == out.dtype() && in.numel() == sent && out.numel() == received,
                 "all_to_all: the input {} must hold the {} elements sent and the output {} the "
                 "{} received, of one dtype", in.str(), sent, out.str(), received);
  op->in = in;
  op->out = out;
  op->send_counts = send_counts;
  op->recv_counts = recv_counts;
  op->bytes = in.nbytes();  // what this rank sends
  return submit(op);
}
void Communicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                              const Tensor& out, const std::vector<int64_t>& recv_counts) {
  all_to_all_async(in, send_counts, out, recv_counts).wait();
}

Work Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp rop) {
  auto op = make_op(OpKind::reduce_scatter);
  check_gathered(out, in, size(), op->kind, "output", "input");
  op->in = in;
  op->out = out;
  op->reduce = rop;
  op->bytes = in.nbytes();
  return submit(op);
}
void Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  reduce_scatter_async(in, out, op).wait();
}

Work Communicator::scatter_async(const Tensor& in, const Tensor& out, int root) {
  auto op = make_op(OpKind::scatter);
  check_tensor(out, op->kind, "output");
  if (rank() == root) check_gathered(out, in, size(), op->kind, "output", "input");
  op->in = in;
  op->out = out;
  op->root = root;
  op->bytes = out.nbytes() * static_cast<std::size_t>(size());
  return submit(op);
}
void Communicator::scatter(const Tensor& in, const Tensor& out, int root) {
  scatter_async(in, out, root).wait();
}

Work Communicator::gather_async(const Tensor& in, const Tensor& out, int root) {
  auto op = make_op(OpKind::gather);
  check_tensor(in, op->kind, "input");
  if (rank() == root) check_gathered(in, out, size(), op->kind, "input", "output");
  op->in = in;
  op->out = out;
  op->root = root;
  op->bytes = in.nbytes() * static_cast<std::size_t>(size());
  return submit(op);
}
void Communicator::gather(const Tensor& in, const Tensor& out, int root) {
  gather_async(in, out, root).wait();
}

Work Communicator::barrier_async() { return submit(make_op(OpKind::barrier)); }
void Communicator::barrier() { barrier_async().wait(); }

Work Communicator::send_async(const Tensor& t, int dst, int tag) {
  auto op = make_op(OpKind::send);
  check_tensor(t, op->kind, "");
  op->in = t;
  op->peer = dst;
  op->tag = tag;
  op->bytes = t.nbytes();
  return submit(op);
}
void Communicator::send(const Tensor& t, int dst, int tag) { send_async(t, dst, tag).wait(); }

Work Communicator::recv_async(const Tensor& t, int src, int tag) {
  auto op = make_op(OpKind::recv);
  check_tensor(t, op->kind, "");
  op->out = t;
  op->peer = src;
  op->tag = tag;
  op->bytes = t.nbytes();
  return submit(op);
}
void Communicator::recv(const Tensor& t, int src, int tag) { recv_async(t, src, tag).wait(); }

std::vector<Work> Communicator::send_recv_async(const std::vector<P2POp>& ops) {
  // Every op checked first: a batch is posted whole or not at all.
  for (const P2POp& p : ops) {
    const OpKind kind = p.kind == P2POp::Kind::send ? OpKind::send : OpKind::recv;
    SCALELAB_CHECK(s_ != nullptr, "{} on an empty Communicator (make one with Communicator::world)",
                   detail::op_kind_name(kind));
    check_tensor(p.tensor, kind, "");
    SCALELAB_CHECK(p.peer >= 0 && p.peer < s_->size, "{}: peer rank {} is outside group {} of {} ranks",
                   detail::op_kind_name(kind), p.peer, s_->name, s_->size);
  }
  std::vector<Work> works;
  works.reserve(ops.size());
  {
    const exec_log::BatchScope batch;  // the execution log marks these ops as one batch
    for (const P2POp& p : ops)
      works.push_back(p.kind == P2POp::Kind::send ? send_async(p.tensor, p.peer, p.tag)
                                                  : recv_async(p.tensor, p.peer, p.tag));
  }
  // The step is complete: a backend that holds send/recvs back until a wait (nccl, to group a
  // step's halves) launches them now, so they travel while the caller computes. Each op's flush
  // is its backend's (a batch may mix CUDA and host tensors under "auto"); calling it twice is
  // harmless.
  for (const Work& w : works)
    if (w.op_->flush) w.op_->flush();
  return works;
}

Communicator Communicator::split(int color, int key, const std::string& name) const {
  SCALELAB_CHECK(s_ != nullptr, "split on an empty Communicator");
  SCALELAB_CHECK(color >= 0, "split: color must be >= 0, got {}", color);
  auto op = make_op(OpKind::split);
  op->color = color;
  op->key = key;
  Work(submit(op)).wait();

  auto s = std::make_shared<detail::CommState>();
  s->name = name.empty() ? fmt::format("{}/{}", s_->name, color) : name;
  s->backend = s_->backend;
  if (s_->backend == "self") {
    s->rank = 0;
    s->size = 1;
    s->world_ranks = s_->world_ranks;
    s->self = detail::make_self_backend();
  } else {
    MPI_Comm c = op->split_comm;
    MPI_Comm_rank(c, &s->rank);
    MPI_Comm_size(c, &s->size);
    // World ranks of the members, in the new group's order.
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(c, &group);
    std::vector<int> mine(s->size);
    for (int r = 0; r < s->size; ++r) mine[r] = r;
    s->world_ranks.resize(s->size);
    MPI_Group_translate_ranks(group, s->size, mine.data(), world_group, s->world_ranks.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    s->mpi = detail::make_mpi_backend(c);
    s->gpu_slots = s_->gpu_slots;
    judge_gpu_sharing(*s);
  }
  s->watchdog_group = watchdog::register_group(s->name, s->world_ranks);
  return Communicator(s);
}

}  // namespace scalelab::comm
