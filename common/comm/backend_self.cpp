// The self backend: a world of one. Every collective is a copy (or nothing); send/recv to
// oneself go through a mailbox, so a program written for n ranks runs unchanged with n = 1 and
// no launcher.
#include <deque>
#include <map>
#include <mutex>

#include "common/comm/op.hpp"
#include "common/errors.hpp"

namespace scalelab::comm::detail {
namespace {

class SelfBackend final : public Backend {
 public:
  void submit(std::shared_ptr<Op> op) override {
    try {
      switch (op->kind) {
        case OpKind::all_reduce:
        case OpKind::reduce:
        case OpKind::broadcast:
        case OpKind::barrier:
        case OpKind::split:
          break;  // one rank: the data already is the result (avg of one value is the value)
        case OpKind::all_gather:
        case OpKind::reduce_scatter:
        case OpKind::scatter:
        case OpKind::gather:
        case OpKind::all_to_all:  // with counts: one rank sends itself what it receives
          op->out.copy_from(op->in);
          break;
        case OpKind::send:
        case OpKind::recv:
          point_to_point(std::move(op));
          return;  // completed when matched
      }
      op->complete();
    } catch (...) {
      op->complete(std::current_exception());
    }
  }

 private:
  // A send completes at once (its data is copied into the mailbox); a recv when a send with its
  // tag is there, in order.
  void point_to_point(std::shared_ptr<Op> op) {
    std::unique_lock lock(mutex_);
    auto& sent = mailbox_[op->tag];
    auto& waiting = receivers_[op->tag];
    if (op->kind == OpKind::send) {
      Tensor copy = op->in.clone();
      lock.unlock();
      op->complete();
      lock.lock();
      if (!waiting.empty()) {
        auto r = std::move(waiting.front());
        waiting.pop_front();
        lock.unlock();
        deliver(r, copy);
      } else {
        sent.push_back(copy);
      }
    } else if (!sent.empty()) {
      Tensor t = std::move(sent.front());
      sent.pop_front();
      lock.unlock();
      deliver(op, t);
    } else {
      waiting.push_back(std::move(op));
    }
  }

  static void deliver(const std::shared_ptr<Op>& recv, const Tensor& data) {
    try {
      SCALELAB_CHECK(data.numel() == recv->out.numel() && data.dtype() == recv->out.dtype(),
                     "{}: received {} from rank 0, expected {} elements of {}", recv->label(),
                     data.str(), recv->out.numel(), dtype_name(recv->out.dtype()));
      recv->out.copy_from(data);
      recv->complete();
    } catch (...) {
      recv->complete(std::current_exception());
    }
  }

  std::mutex mutex_;
  std::map<int, std::deque<Tensor>> mailbox_;
  std::map<int, std::deque<std::shared_ptr<Op>>> receivers_;
};

}  // namespace

std::unique_ptr<Backend> make_self_backend() { return std::make_unique<SelfBackend>(); }

}  // namespace scalelab::comm::detail
