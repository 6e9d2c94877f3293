/// @file beyond_lockstep.h
/// @brief Chapter 11 contract: training that does not march in lockstep.
///
/// Every chapter so far is synchronous: all ranks take step s together and
/// one slow or failed rank stops the rest. This chapter loosens that, one
/// idea at a time:
///
/// - a parameter server (11.1) answers the workers' pull and push requests,
///   whoever asks first, over dtp/rpc.h: it must train exactly as data
///   parallelism does;
/// - bounded staleness (11.2) lets a worker run up to s rounds ahead on
///   parameters that are not yet up to date, and logs which version every
///   gradient was computed on;
/// - local SGD (11.3) lets every worker take H steps alone, then averages
///   the parameters;
/// - DiLoCo (11.4) runs H steps of AdamW alone, then treats the averaged
///   change as a gradient for an outer Nesterov step.
///
/// Ranks. In 11.1 and 11.2 rank 0 is the server, not a worker; the W =
/// comm.size() - 1 workers are ranks 1..W, and worker w trains on slice
/// w - 1 of W of each global batch (its Trainer is `Trainer(config, w - 1,
/// W)`). In 11.3 and 11.4 every rank is a worker (`Trainer(config,
/// comm.rank(), comm.size())`). The runs are on the CPU (thread or mpi
/// backend: dtp/rpc.h needs Comm::recv_any). See
/// chapters/11_beyond_lockstep/README.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/gpt.h"
#include "dtp/optim.h"
#include "dtp/rpc.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

/// Chapter 11: beyond lockstep.
namespace dtp::ch11 {

// --- provided: the parameter server's protocol ------------------------------------

/// The server's methods, by number: kPull asks for the whole model, kPush
/// sends one unit's gradient, kDone says a worker has finished.
enum PsMethod { kPull = 0, kPush = 1, kDone = 2 };
/// Their names, in that order ({"pull", "push", "done"}).
const std::vector<std::string>& ps_methods();

/// The requests of one worker step c (from 1), in this order:
/// - pull: `call(kPull, -1, c, Tensor())`; the response's payload is every
///   unit's parameters concatenated in model order (flat) and its version
///   is the number of rounds the server had applied, v;
/// - push, for each unit u in model order: `call(kPush, u, v,
///   gradient of u, flat)`; the response is an acknowledgement (no payload);
/// and after the last step `call(kDone, -1, 0, Tensor())`.
/// A worker's c-th push of unit u belongs to round c (from 1). A worker's
/// done may come while other workers still push the last round.

/// What the server logs for every gradient it applies.
struct Applied {
  int worker = 0;                ///< rank, 1..W
  std::int64_t round = 0;        ///< from 1
  std::int64_t computed_on = 0;  ///< the version v its pull returned (rounds applied then)
};

/// Provided: rank 0 of a parameter-server run. It holds the model (its
/// Trainer's, built as `Trainer(config)`: the full batch is never used) and
/// the optimizer over it, answers requests through `server`, and keeps the
/// log. The puzzles write its serve loops.
class ParameterServer {
 public:
  /// Provided. Serves @p comm's ranks 1..W; @p config is the run's (the
  /// workers' too). @p timeout_seconds bounds every wait for a request.
  ParameterServer(Comm& comm, const TrainConfig& config, double timeout_seconds = 60);

  /// Puzzle 11.1. Synchronous: serves config.steps rounds, then the W done
  /// requests. Round r (from 1): answer every worker's pull of step r with
  /// the current parameters and version r - 1, take the U pushes of every
  /// worker (any order, interleaved with other workers' requests), and
  /// when all W x U have come apply_round(r). A pull of step r + 1 that
  /// comes before round r is applied waits (the server answers it after
  /// applying). Throws dtp::Error naming the worker and what it sent when a
  /// push comes for a round that is not the one being collected.
  void serve_synchronous();

  /// Puzzle 11.2. Bounded staleness @p staleness = s >= 0: a worker's pull
  /// of step c is answered as soon as the server has applied at least
  /// c - 1 - s rounds (with what it has then: version v >= c - 1 - s), so
  /// a worker may compute on parameters up to s rounds old. Pushes are
  /// kept per round; round r is applied (apply_round) once all W workers'
  /// U pushes of round r are in and rounds before it are applied. Every
  /// applied gradient is logged once, in applying order (round, then
  /// worker). It returns, as serve_synchronous(), once all W workers have
  /// sent done. s = 0 must train exactly as serve_synchronous(). Throws
  /// dtp::Error naming the worker, the round and the version when a push
  /// is older than the bound allows (v < r - 1 - s).
  void serve_bounded(int staleness);

  /// Provided. Applies round @p round: for every unit, the gradient is the
  /// mean of the W workers' gradients of that round, added in worker
  /// order (1, 2, ..., W) and multiplied by 1/W (as ReduceOp::avg does);
  /// @p gradients[w - 1][u] is worker w's of unit u. Then the optimizer clips and
  /// steps with the learning rate of step @p round. Logs each worker's
  /// gradient as applied, computed on @p versions[w - 1].
  void apply_round(std::int64_t round, const std::vector<std::vector<Tensor>>& gradients,
                   const std::vector<std::int64_t>& versions);

  /// The parameters of every unit, concatenated in model order (what a pull answers).
  Tensor parameters() const;
  /// Rounds applied so far (the version).
  std::int64_t version() const { return version_; }
  /// Every gradient applied, in order.
  const std::vector<Applied>& log() const { return log_; }
  /// The server's model (the checkers read its parameters).
  GPT& model() { return trainer_.model(); }
  /// The rpc server (its received() counts per method).
  rpc::Server& server() { return server_; }
  /// Workers W.
  int workers() const { return comm_.size() - 1; }
  /// The run's config.
  const TrainConfig& config() const { return trainer_.config(); }
  /// How long every wait for a request may take.
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  Comm& comm_;
  Trainer trainer_;
  rpc::Server server_;
  double timeout_seconds_;
  std::int64_t version_ = 0;
  std::vector<Applied> log_;
};

/// Provided: a worker of a parameter-server run (ranks 1..W). Its Trainer
/// computes the loss and the gradients of its slice; its optimizer does
/// nothing (the server updates).
class PsWorker {
 public:
  /// Provided. Its Trainer (Trainer(config, rank - 1, W), with a no-op
  /// optimizer) and its rpc client of rank 0.
  PsWorker(Comm& comm, const TrainConfig& config, double timeout_seconds = 60);

  /// Puzzle 11.1. One step: pull (the protocol above), copy the payload
  /// into the units' parameters, train one step of this worker's slice
  /// (trainer().step(): forward, backward, a no-op update) and push every
  /// unit's gradient with the pull's version. Returns the step's loss.
  double step();
  /// Provided. Tells the server this worker is finished (kDone).
  void finish();

  /// The versions this worker's pulls returned, per step.
  const std::vector<std::int64_t>& versions() const { return versions_; }
  /// Its Trainer (this worker's slice, a no-op optimizer).
  Trainer& trainer() { return trainer_; }
  /// Its rpc client of rank 0.
  rpc::Client& client() { return client_; }

 private:
  Comm& comm_;
  Trainer trainer_;
  rpc::Client client_;
  std::vector<std::int64_t> versions_;
};

// --- 11.3 and 11.4: communicate every H steps ----------------------------------------

/// Puzzle 11.3. Local SGD. Each rank trains alone (its Trainer's steps,
/// its own optimizer state) and, after every @p h local steps, replaces its
/// parameters by their mean over the ranks: one all-reduce (ReduceOp::avg)
/// per unit of params(). The optimizer state stays local. h = 1 with SGD
/// without momentum equals data parallelism.
class LocalSgd {
 public:
  /// @p trainer is this rank's (Trainer(config, comm.rank(), comm.size()),
  /// every rank from the same parameters). Throws dtp::Error naming @p h
  /// when it is below 1.
  LocalSgd(Comm& comm, Trainer& trainer, int h);
  /// One local step (trainer.step()), then the average when it completes
  /// a period of h. Returns the step's record.
  StepRecord step();
  /// Averages done so far.
  std::int64_t averages() const { return averages_; }

 private:
  Comm& comm_;
  Trainer& trainer_;
  int h_;
  std::int64_t averages_ = 0;
};

/// DiLoCo's outer optimizer settings (Douillard et al. 2023: lr 0.7, momentum 0.9).
struct OuterConfig {
  double lr = 0.7;        ///< the outer learning rate
  double momentum = 0.9;  ///< Nesterov momentum
};

/// Puzzle 11.4. DiLoCo. Every rank keeps the global parameters theta (a
/// copy: the same on every rank) and an outer momentum m (zero at the
/// start), and trains its own model with its Trainer's optimizer (AdamW,
/// the inner optimizer, its state kept across outer steps). After every
/// @p h inner steps, per unit:
///   delta = theta - params (this rank's pseudo-gradient);
///   all-reduce delta (ReduceOp::avg);
///   m = momentum * m + delta;
///   theta = theta - lr * (delta + momentum * m);   (Nesterov)
///   params = theta.
/// Each line in the model's dtype, element by element, in that order.
class DiLoCo {
 public:
  /// Copies the trainer's parameters into theta. Throws dtp::Error naming
  /// @p h when it is below 1.
  DiLoCo(Comm& comm, Trainer& trainer, int h, const OuterConfig& outer);
  /// One inner step (trainer.step()), then the outer step when it
  /// completes a period of h. Returns the inner step's record.
  StepRecord step();
  /// Outer steps done so far.
  std::int64_t outer_steps() const { return outer_steps_; }
  /// theta of unit @p unit (flat).
  const Tensor& global_parameters(int unit) const;
  /// m of unit @p unit (flat).
  const Tensor& outer_momentum(int unit) const;

 private:
  Comm& comm_;
  Trainer& trainer_;
  int h_;
  OuterConfig outer_;
  std::vector<Tensor> theta_;     // per unit
  std::vector<Tensor> momentum_;  // per unit
  std::int64_t outer_steps_ = 0;
};

// --- 11.5: a data-parallel step that survives a failed replica ----------------------

/// What the coordinator does when a replica does not contribute in time.
enum class Recovery {
  continue_with_quorum,  ///< drop it for good; the others go on (a new quorum)
  restart,               ///< stop everyone; the run restarts from its last checkpoint
};

/// The coordinator's one method: a replica's gradient of a step.
enum FtMethod { kContribute = 0 };
/// Its name ({"contribute"}).
const std::vector<std::string>& ft_methods();

/// What the coordinator logs per step.
struct QuorumStep {
  std::int64_t step = 0;         ///< from 1
  std::vector<int> quorum;       ///< replicas whose gradients were averaged, ascending
  std::vector<int> failed;       ///< replicas declared failed at this step, ascending
  double detection_seconds = 0;  ///< from the step's first contribution to the decision
  bool restart = false;          ///< the step ended the run (Recovery::restart)
};

/// Provided: rank 0 of a fault-tolerant run, the coordinator (a lighthouse:
/// it holds no parameters and is assumed not to fail). Replicas are ranks
/// 1..W; all start live.
class Coordinator {
 public:
  /// @p detect_seconds: how long after a step's first contribution a live
  /// replica may take before it is declared failed.
  Coordinator(Comm& comm, Recovery recovery, double detect_seconds);

  /// Puzzle 11.5 (coordinator half). Step @p step: take contributions
  /// (`call(kContribute, step, 0, gradient)`) until every live replica has
  /// contributed, or detect_seconds have passed since the first one; the
  /// live replicas not heard from are failed. A contribution for another
  /// step, or from a replica that is not live, is refused
  /// (server().refuse, version -1) and not used. Then:
  /// - with no failure, or under Recovery::continue_with_quorum: the
  ///   failed leave live() for good, and every quorum member is answered
  ///   (server().reply) with the mean of the quorum's gradients, added in
  ///   replica order and multiplied by 1/|quorum|, and with version = the
  ///   quorum as a bit mask (bit w for replica w). Returns true.
  /// - under Recovery::restart with a failure: every quorum member is
  ///   refused (version -1). Returns false: the run stops.
  /// Logs the step (log()). Throws dtp::Error naming the step when no
  /// replica contributed within timeout_seconds(), or none is live.
  bool step(std::int64_t step);

  /// Live replicas, ascending.
  const std::vector<int>& live() const { return live_; }
  /// Every step so far.
  const std::vector<QuorumStep>& log() const { return log_; }
  /// The rpc server its replicas call.
  rpc::Server& server() { return server_; }
  /// What a failure leads to.
  Recovery recovery() const { return recovery_; }
  /// How long after a step's first contribution the rest may take.
  double detect_seconds() const { return detect_seconds_; }
  /// How long a step may wait for its first contribution: 60 s.
  double timeout_seconds() const { return 60; }

 private:
  Comm& comm_;
  rpc::Server server_;
  Recovery recovery_;
  double detect_seconds_;
  std::vector<int> live_;
  std::vector<QuorumStep> log_;
};

/// Provided: a replica of a fault-tolerant run (ranks 1..W). Replicas hold
/// the same parameters and optimizer state, and apply the same mean.
class FtReplica {
 public:
  /// Its Trainer (Trainer(config, rank - 1, W): its slice of each global
  /// batch) and its rpc client of rank 0, whose calls wait at most
  /// @p timeout_seconds.
  FtReplica(Comm& comm, const TrainConfig& config, double timeout_seconds);

  /// Puzzle 11.5 (replica half). One step of the trainer: forward and
  /// backward of this replica's batch; contribute every unit's gradient
  /// (flat, in model order, key = the step, counted from 1); when the answer
  /// is the mean (Status::ok), copy it into the units' gradients and let
  /// the trainer clip and step with the optimizer, as a data-parallel
  /// replica does, note the quorum (the answer's version), and return true.
  /// When it is refused, or no answer comes (rpc::Timeout: the coordinator
  /// is gone or dropped this replica), return false and leave the model
  /// as it was before the step: this replica takes no more steps.
  bool step();

  /// The quorum of the last step that returned true (bit w: replica w).
  std::int64_t quorum() const { return quorum_; }
  /// Its Trainer (this replica's slice, its optimizer).
  Trainer& trainer() { return trainer_; }
  /// Its rpc client of rank 0.
  rpc::Client& client() { return client_; }

 private:
  Comm& comm_;
  Trainer trainer_;
  rpc::Client client_;
  std::int64_t quorum_ = 0;
};

/// Settings of a fault-tolerant run (run_fault_tolerant).
struct FtOptions {
  Recovery recovery = Recovery::continue_with_quorum;  ///< what a failure leads to
  double detect_seconds = 0.5;                         ///< Coordinator's
  double replica_timeout_seconds = 2;                  ///< FtReplica's: longer than detect_seconds
  std::int64_t checkpoint_every = 0;  ///< Recovery::restart: a checkpoint every k steps
  std::string checkpoint_path;        ///< where (one file, overwritten)
  int max_restarts = 3;               ///< a run that needs more throws
};

/// What a fault-tolerant run did (filled on rank 0's process).
struct FtResult {
  std::vector<QuorumStep> log;               ///< every step of every launch, in order
  std::vector<std::int64_t> restarted_from;  ///< per restart: the checkpoint's step (0: none)
  std::vector<int> survivors;                ///< replicas live at the end
  std::vector<double> parameters;            ///< the survivors' parameters, flat (equal bits)
  std::vector<std::string> events;           ///< what happened, one line each
};

/// Provided: runs config.steps steps on @p world ranks (rank 0 the
/// coordinator) as the options say, relaunching from the last checkpoint
/// under Recovery::restart. Each replica calls fault::at_step(comm, s)
/// before each step s. After the last step each survivor sends its
/// parameters to rank 0, which checks that they are the same bits.
/// Throws dtp::Error naming the replicas when the survivors differ, and
/// when the run needed more than max_restarts restarts.
FtResult run_fault_tolerant(int world, const TrainConfig& config, const FtOptions& options);

}  // namespace dtp::ch11
