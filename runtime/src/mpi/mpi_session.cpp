#include "mpi/mpi_session.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "dtp/error.h"

namespace dtp::mpi {

namespace {
constexpr int kFailureTag = 1;
constexpr int kTimeoutTag = 2;
constexpr long kSpinsBeforeYielding = 100;

// Notices are sent and forgotten; their buffers must outlive the sends.
std::vector<std::shared_ptr<std::string>> notice_buffers;
}  // namespace

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string(call) +
              " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  // One thread per process calls MPI: the one that called launch().
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

int process_rank() {
  ensure_initialized();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int process_count() {
  ensure_initialized();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int process_count_without_init() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"})
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  return 1;
}

Session::Session(const World& config, MPI_Comm comm) : config_(config), comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check(MPI_Comm_dup(comm_, &control_), "MPI_Comm_dup");
  check(MPI_Comm_dup(comm_, &exit_), "MPI_Comm_dup");
  auto mine = std::make_shared<Traffic>();
  mine->comm = comm_;
  check(MPI_Comm_dup(comm_, &mine->check), "MPI_Comm_dup");
  mine->sent.assign(static_cast<std::size_t>(size_), 0);
  mine->received.assign(static_cast<std::size_t>(size_), 0);
  traffic.push_back(mine);
}

Session::~Session() {
  // After a failure peers may still hold messages for these communicators;
  // freeing them would be a collective call that can hang, so leave them.
  if (failed_rank_ >= 0) return;
  for (auto& t : traffic) {  // the world's included
    MPI_Comm_free(&t->comm);
    MPI_Comm_free(&t->check);
  }
  MPI_Comm_free(&control_);
  MPI_Comm_free(&exit_);
}

void Session::leave() {
  if (std::exchange(left_, true)) return;
  MPI_Request request;
  check(MPI_Ibarrier(exit_, &request), "MPI_Ibarrier");
  // In slices that give up by themselves: the others may run for longer
  // than DTP_TIMEOUT; a failure elsewhere still ends the wait.
  while (!poll_until(
      [&] {
        int done = 0;
        check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
      },
      [] { return std::string("every rank to return from its function"); }, 1.0)) {
  }
}

void Session::poll_notices() {
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, control_, &flag, &status);
  if (!flag) return;
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string text(static_cast<std::size_t>(length), '\0');
  MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, control_,
           MPI_STATUS_IGNORE);
  if (failed_rank_ < 0) {
    failed_rank_ = status.MPI_SOURCE;
    failure_message_ = text;
  }
}

void Session::wait(std::vector<MPI_Request>& requests, const std::function<std::string()>& describe,
                   std::vector<MPI_Status>* statuses) {
  if (statuses) statuses->resize(requests.size());
  MPI_Status* out = statuses ? statuses->data() : MPI_STATUSES_IGNORE;
  poll_until(
      [&] {
        int done = 0;
        check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, out),
              "MPI_Testall");
        return done != 0;
      },
      describe, -1);
}

bool Session::poll_until(const std::function<bool()>& done,
                         const std::function<std::string()>& describe, double give_up_seconds) {
  // Most waits end within microseconds: the clock and the notices are read
  // from the 64th poll on, every 64 polls (each costs about as much as a poll).
  std::chrono::steady_clock::time_point start;
  for (long spins = 0;; ++spins) {
    if (done()) return true;
    if (spins % 64 == 63) {
      if (spins == 63) start = std::chrono::steady_clock::now();
      poll_notices();
      if (failed_rank_ >= 0) {
        std::fprintf(stderr, "[dtp mpi] rank %d: stopped while waiting for %s\n", rank_,
                     describe().c_str());
        throw CommAborted("rank " + std::to_string(rank_) + " stopped because rank " +
                          std::to_string(failed_rank_) + " failed: " + failure_message_);
      }
      double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (give_up_seconds >= 0 && waited > give_up_seconds) return false;
      if (waited > config_.timeout_seconds) {
        char head[256];
        std::snprintf(head, sizeof head, "timeout: rank %d waited %.1f s (DTP_TIMEOUT) for %s",
                      rank_, config_.timeout_seconds, describe().c_str());
        // Ask the others to say what they are doing, give them a moment to
        // print, then end the job: a timed-out MPI job cannot be recovered.
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          auto text = std::make_shared<std::string>(head);
          notice_buffers.push_back(text);
          MPI_Request request;
          MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, r, kTimeoutTag,
                    control_, &request);
          MPI_Request_free(&request);
        }
        std::fprintf(stderr,
                     "[dtp mpi] %s\nEvery other rank prints what it was waiting for; a rank "
                     "that prints nothing was computing (not inside a communication call).\n",
                     head);
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
    // A long wait yields the core to oversubscribed ranks (more processes
    // than cores); a short one spins, since a yield per poll cost 4 us per
    // small collective (2 ranks, 1 KiB all-reduce: 6.5 us against 2.0).
    if (spins >= kSpinsBeforeYielding) sched_yield();
  }
}

void Session::throw_if_peer_failed() {
  poll_notices();
  if (failed_rank_ >= 0 && failed_rank_ != rank_)
    throw CommAborted("rank " + std::to_string(rank_) + " stopped because rank " +
                      std::to_string(failed_rank_) + " failed: " + failure_message_);
}

void Session::announce_failure(const std::string& message) {
  if (failed_rank_ < 0) failed_rank_ = rank_, failure_message_ = message;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto text = std::make_shared<std::string>(message);
    notice_buffers.push_back(text);
    MPI_Request request;
    MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, r, kFailureTag, control_,
              &request);
    MPI_Request_free(&request);
  }
}

void Session::keep_until_sent(std::shared_ptr<void> buffer, MPI_Request request) {
  sends_.push_back({std::move(buffer), request});
}

void Session::reap_sends() {
  std::size_t kept = 0;
  for (PendingSend& s : sends_) {
    int done = 0;
    MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
    if (!done) sends_[kept++] = std::move(s);
  }
  sends_.resize(kept);
}

void Session::finish_sends() {
  std::vector<MPI_Request> requests;
  for (PendingSend& s : sends_) requests.push_back(s.request);
  wait(requests, [] { return std::string("its own eager sends to be delivered"); });
  sends_.clear();
}

}  // namespace dtp::mpi
