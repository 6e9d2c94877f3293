// A distributed step as one record: every rank's numbers gathered to rank 0.
#include "dtp/train_report.h"

#include <algorithm>

#include "dtp/error.h"

namespace dtp {

std::vector<std::vector<double>> gather_rows_to_rank0(Comm& comm, const std::vector<double>& row) {
  const auto width = static_cast<std::int64_t>(row.size());
  Tensor mine = Tensor::from_values(row, DType::f64).to(comm.device());
  Tensor all = Tensor::zeros(Shape{width * comm.size()}, DType::f64, comm.device());
  comm.gather(mine, all, 0);
  std::vector<std::vector<double>> rows;
  if (comm.rank() != 0) return rows;
  const std::vector<double> v = all.to_vector();
  for (int r = 0; r < comm.size(); ++r)
    rows.emplace_back(v.begin() + r * width, v.begin() + (r + 1) * width);
  return rows;
}

std::vector<RankStepRow> report_group_step(Comm& comm, StepRecord& record,
                                           const std::vector<double>& extra,
                                           const GroupStepRule& rule) {
  std::vector<double> mine = {record.loss, record.seconds, static_cast<double>(record.tokens)};
  mine.insert(mine.end(), extra.begin(), extra.end());
  const std::vector<std::vector<double>> gathered = gather_rows_to_rank0(comm, mine);
  std::vector<RankStepRow> rows;
  if (comm.rank() != 0) return rows;
  double slowest = 0, tokens = 0, loss_sum = 0;
  int slices = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<double>& row = gathered[static_cast<std::size_t>(r)];
    rows.push_back({row[0], row[1], row[2], std::vector<double>(row.begin() + 3, row.end())});
    slowest = std::max(slowest, row[1]);
    if (rule.own_slice && !rule.own_slice(r)) continue;
    loss_sum += row[0];
    tokens += row[2];
    ++slices;
  }
  DTP_CHECK(slices > 0, "report_group_step: the rule counts none of the ", comm.size(), " ranks");
  if (rule.mean_loss) record.loss = loss_sum / slices;
  record.seconds = slowest;
  record.tokens = static_cast<std::int64_t>(tokens);
  record.tokens_per_second = slowest > 0 ? tokens / slowest : 0;
  return rows;
}

}  // namespace dtp
