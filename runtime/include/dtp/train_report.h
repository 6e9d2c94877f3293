/// @file train_report.h
/// @brief A distributed step as one record: every rank's numbers gathered to
/// rank 0, and the group's step made from them (global tokens and loss, the
/// slowest rank's time).
#pragma once

#include <functional>
#include <vector>

#include "dtp/comm.h"
#include "dtp/trainer.h"

namespace dtp {

/// A strategy's per-rank report: gathers every rank's @p row (the same
/// length on every rank) to rank 0 of @p comm. Rank 0 gets one row per
/// rank, in rank order; the others get an empty list. Collective.
std::vector<std::vector<double>> gather_rows_to_rank0(Comm& comm, const std::vector<double>& row);

/// How a group of ranks makes one step of their records (report_group_step).
struct GroupStepRule {
  /// The ranks that hold a slice of the batch of their own: their tokens
  /// count, and their losses make the mean. Empty: every rank (data
  /// parallel). Ranks that share a slice count it once (tensor parallel:
  /// one rank per tensor-parallel group; sequence parallel: rank 0).
  std::function<bool(int rank)> own_slice;
  /// True: each rank's loss is of its own slice, and the group's is their
  /// mean (equal slices: the mean of the means is the batch's mean). False:
  /// the step already reduced the loss, and rank 0's is the group's.
  bool mean_loss = true;
};

/// One rank's numbers of a group step, as rank 0 received them.
struct RankStepRow {
  double loss = 0;            ///< the rank's own loss
  double seconds = 0;         ///< the rank's own step time
  double tokens = 0;          ///< the tokens of the rank's own record
  std::vector<double> extra;  ///< the rank's @p extra of report_group_step
};

/// The step of a whole group, reported by rank 0. Collective over @p comm:
/// every rank passes its own @p record and @p extra numbers (as many on
/// every rank). On rank 0 @p record becomes the group's step: the slowest
/// rank's seconds (the step is done when its last rank is), the tokens and
/// loss of the ranks @p rule counts, tokens per second from those; the
/// result holds every rank's row, in rank order. The other ranks get an
/// empty list and keep their record.
std::vector<RankStepRow> report_group_step(Comm& comm, StepRecord& record,
                                           const std::vector<double>& extra = {},
                                           const GroupStepRule& rule = {});

}  // namespace dtp
