// A team of helper threads per rank thread, made on first use and kept (a
// thread costs tens of microseconds to start; a step calls parallel_for
// hundreds of times).
#include "dtp/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtp/error.h"

namespace dtp {

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  DTP_CHECK(*end == '\0' && parsed >= 1 && parsed <= 4096, name, "=", value,
            " is not a thread count (expected an integer from 1 to 4096)");
  return static_cast<int>(parsed);
}

thread_local int this_thread_threads = 0;  // 0: the default

// Helpers wait for a ticket: the loop's number and its part count in one
// atomic word, so a helper never mixes one loop's count with another's. They
// spin for a short while first (a step runs hundreds of loops of ~100 us each;
// waking a sleeping thread costs tens of microseconds), then sleep.
class Team {
 public:
  explicit Team(int helpers) {
    for (int h = 0; h < helpers; ++h) helpers_.emplace_back([this, h] { serve(h + 1); });
  }
  ~Team() {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true);
    }
    wake_.notify_all();
    for (std::thread& helper : helpers_) helper.join();
  }
  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs part(p) for p in [0, parts) with parts <= size(); the caller runs part 0.
  void run(int parts, const std::function<void(int)>& part) {
    part_ = &part;
    error_ = nullptr;
    pending_.store(parts - 1);
    {
      std::lock_guard lock(mutex_);
      ticket_.store(((ticket_.load() >> kPartBits) + 1) << kPartBits |
                    static_cast<std::uint64_t>(parts));
    }
    wake_.notify_all();
    std::exception_ptr mine;
    // Part 0 runs here; a loop inside it runs on this thread alone, as one
    // inside a helper's part does (the team is busy).
    const int threads = this_thread_threads;
    this_thread_threads = 1;
    try {
      part(0);
    } catch (...) {
      mine = std::current_exception();
    }
    this_thread_threads = threads;
    if (!spin_until([&] { return pending_.load() == 0; })) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return pending_.load() == 0; });
    }
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr int kPartBits = 16;  // parts <= 4096

  // True when @p ready() held within about 50 microseconds.
  template <typename Ready>
  static bool spin_until(Ready ready) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    for (int i = 0;; ++i) {
      if (ready()) return true;
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > give_up) return false;
    }
  }

  void serve(int index) {
    this_thread_threads = 1;  // a loop inside a part runs on its helper alone
    std::uint64_t seen = 0;
    for (;;) {
      auto news = [&] { return stopping_.load() || ticket_.load() != seen; };
      if (!spin_until(news)) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, news);
      }
      if (stopping_.load()) return;
      seen = ticket_.load();
      const int parts = static_cast<int>(seen & ((1u << kPartBits) - 1));
      if (index >= parts) continue;
      try {
        (*part_)(index);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1) == 1) {
        std::lock_guard lock(mutex_);  // the caller may be about to sleep on done_
        done_.notify_one();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> helpers_;
  const std::function<void(int)>* part_ = nullptr;  // set before the ticket, read after it
  std::atomic<std::uint64_t> ticket_{0};            // loop number << kPartBits | parts
  std::atomic<int> pending_{0};                     // helpers' parts not yet done
  std::atomic<bool> stopping_{false};
  std::exception_ptr error_;  // the first part that threw (under mutex_)
};

Team& team_of_this_thread(int threads) {
  thread_local std::unique_ptr<Team> team;
  if (!team || team->size() != threads) {
    team.reset();
    team = std::make_unique<Team>(threads - 1);
  }
  return *team;
}

}  // namespace

int default_compute_threads() {
  static const int threads = [] {
    if (const int forced = env_int("DTP_THREADS")) return forced;
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    int processes = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (processes == 0) processes = env_int("MPI_LOCALNRANKS");
    return std::max(1, cores / std::max(1, processes));
  }();
  return threads;
}

int compute_threads() {
  return this_thread_threads > 0 ? this_thread_threads : default_compute_threads();
}

void set_compute_threads(int threads) {
  DTP_CHECK(threads >= 1, "set_compute_threads: a rank computes with at least 1 thread, got ",
            threads);
  this_thread_threads = threads;
}

void parallel_for(std::int64_t n, std::int64_t min_part,
                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  const std::int64_t most = std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, min_part));
  const int parts = static_cast<int>(std::min<std::int64_t>(compute_threads(), most));
  if (parts <= 1) return body(0, n);
  // Equal contiguous parts; the first n % parts get one item more.
  const std::int64_t base = n / parts, extra = n % parts;
  Team& team = team_of_this_thread(compute_threads());
  team.run(parts, [&](int p) {
    const std::int64_t begin = p * base + std::min<std::int64_t>(p, extra);
    body(begin, begin + base + (p < extra ? 1 : 0));
  });
}

}  // namespace dtp
