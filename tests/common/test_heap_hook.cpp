// The counting malloc of the test binaries (tests/support/heap.hpp, heap_hook.cpp) counts the
// rank's threads only (rank_threads.hpp): the test's own thread and the threads it starts, never
// the library's background threads (a communicator's worker, the watchdog) or MPI's, whose
// allocations under load once failed a correct lab 07 submission. A free takes back what its
// allocation added, whichever thread frees.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "common/background_thread.hpp"
#include "tests/support/heap.hpp"
#include "tests/support/rank_threads.hpp"

using namespace scalelab;

namespace {

constexpr std::size_t kBlock = 1 << 20;

// Keeps the compiler from dropping an allocation it can see is unused.
void touch(void* p) { static_cast<volatile char*>(p)[0] = 1; }

// A thread that runs `fn` on request, so a test can order what happens on two threads.
class Helper {
 public:
  explicit Helper(bool background) {
    thread_ = std::thread([this, background] {
      if (background) mark_background_thread();
      std::unique_lock lock(mutex_);
      while (true) {
        cv_.wait(lock, [&] { return job_ || stop_; });
        if (stop_) return;
        job_();
        job_ = nullptr;
        cv_.notify_all();
      }
    });
  }
  ~Helper() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> fn) {  // waits for it
    std::unique_lock lock(mutex_);
    job_ = std::move(fn);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !job_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

TEST(HeapHook, TheTestsThreadCounts) {
  EXPECT_TRUE(labtest::on_rank_thread());
  void* p = nullptr;
  const labtest::HeapGrowth g = labtest::heap_growth_of([&] {
    p = std::malloc(kBlock);
    touch(p);
  });
  EXPECT_GE(g.peak, static_cast<int64_t>(kBlock));
  EXPECT_GE(g.held, static_cast<int64_t>(kBlock));
  const labtest::HeapGrowth freed = labtest::heap_growth_of([&] { std::free(p); });
  EXPECT_LE(freed.held, -static_cast<int64_t>(kBlock));
}

// A copy kept by a thread the code under test starts is the rank's memory.
TEST(HeapHook, AThreadTheTestStartsCounts) {
  const labtest::HeapGrowth g = labtest::heap_growth_of([&] {
    std::thread([] {
      EXPECT_TRUE(labtest::on_rank_thread());
      std::vector<char> copy(kBlock, 1);
      touch(copy.data());
      // and a thread it starts in turn
      std::thread([] { EXPECT_TRUE(labtest::on_rank_thread()); }).join();
    }).join();
  });
  EXPECT_GE(g.peak, static_cast<int64_t>(kBlock));
}

// What a background thread allocates and frees meanwhile is not the rank's: the figure of a call
// that allocates nothing stays exactly 0 however busy the worker is.
TEST(HeapHook, ABackgroundThreadsAllocationsDoNotCount) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> rounds{0};
  std::thread busy([&] {
    mark_background_thread();
    EXPECT_FALSE(labtest::on_rank_thread());
    std::vector<void*> held;
    while (!stop) {
      held.push_back(std::malloc(4096));
      touch(held.back());
      if (held.size() == 64) {
        for (void* p : held) std::free(p);
        held.clear();
      }
      ++rounds;
    }
    for (void* p : held) std::free(p);
  });
  while (rounds < 1000) std::this_thread::yield();
  const labtest::HeapGrowth g = labtest::heap_growth_of([&] {
    const int64_t until = rounds + 20000;
    while (rounds < until) std::this_thread::yield();
  });
  stop = true;
  busy.join();
  EXPECT_EQ(g.peak, 0) << "a background thread's allocations counted";
  EXPECT_EQ(g.held, 0);
}

// A free takes back what its allocation added, whichever thread makes it.
TEST(HeapHook, AFreeOnAnotherThreadTakesBackWhatItsAllocationAdded) {
  Helper worker(/*background=*/true);
  void* mine = nullptr;
  void* theirs = nullptr;
  const labtest::HeapGrowth g = labtest::heap_growth_of([&] {
    mine = std::malloc(kBlock);  // the rank's: counted
    touch(mine);
    worker.run([&] {
      theirs = std::malloc(kBlock);  // the worker's: never counted
      touch(theirs);
      std::free(mine);  // the rank's block, freed by the worker: leaves the figure
    });
    std::free(theirs);  // the worker's block, freed by the rank: changes nothing
  });
  EXPECT_GE(g.peak, static_cast<int64_t>(kBlock));
  EXPECT_LT(g.peak, static_cast<int64_t>(2 * kBlock));
  EXPECT_EQ(g.held, 0) << "the rank's block went back; the worker's never came in";
}

// realloc moves a block between the figures as malloc and free would.
TEST(HeapHook, ReallocOfAnotherThreadsBlockBecomesTheRanks) {
  Helper worker(/*background=*/true);
  void* p = nullptr;
  worker.run([&] { p = std::malloc(64); });
  const labtest::HeapGrowth g = labtest::heap_growth_of([&] {
    p = std::realloc(p, kBlock);
    touch(p);
  });
  EXPECT_GE(g.held, static_cast<int64_t>(kBlock));
  const labtest::HeapGrowth back = labtest::heap_growth_of([&] { std::free(p); });
  EXPECT_LE(back.held, -static_cast<int64_t>(kBlock));
}

// A thread started by a background thread is not the rank's either.
TEST(HeapHook, AThreadABackgroundThreadStartsDoesNotCount) {
  Helper worker(/*background=*/true);
  bool counted = true;
  worker.run([&] { std::thread([&] { counted = labtest::on_rank_thread(); }).join(); });
  EXPECT_FALSE(counted);
}
