// Rows of a batch for the mixture-of-experts puzzles. Gathering an expert's
// rows is an embedding lookup whose "table" is the activations and whose
// "ids" are the token rows; adding outputs back is the embedding's backward
// (a scatter-add). The row lists live on the host (routing is decided
// there), so each call uploads them as a small i32 tensor.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

namespace {
Tensor row_ids(const std::vector<std::int32_t>& rows, std::int64_t N, Device device,
               const char* who) {
  std::vector<double> values;
  values.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    DTP_CHECK(rows[i] >= 0 && rows[i] < N, who, ": row ", i, " is ", rows[i],
              ", outside the batch's ", N, " rows");
    values.push_back(rows[i]);
  }
  return Tensor::from_values(values, DType::i32, device);
}

void check_matrix(const Tensor& x, const char* who, const char* name) {
  DTP_CHECK(x.defined() && x.ndim() == 2, who, ": ", name, " must be [rows, C], got ",
            x.defined() ? x.describe() : std::string("an undefined tensor"));
}
}  // namespace

Tensor gather_rows(const Tensor& x, const std::vector<std::int32_t>& rows) {
  check_matrix(x, "gather_rows", "x");
  const auto n = static_cast<std::int64_t>(rows.size());
  Tensor out = Tensor::empty({n, x.size(1)}, x.dtype(), x.device(), MemoryCategory::activations);
  if (n > 0) ops::embedding_forward(row_ids(rows, x.size(0), x.device(), "gather_rows"), x, out);
  return out;
}

void scatter_add_rows(const Tensor& src, const std::vector<std::int32_t>& rows, Tensor& y) {
  check_matrix(src, "scatter_add_rows", "src");
  check_matrix(y, "scatter_add_rows", "y");
  DTP_CHECK(src.size(0) == static_cast<std::int64_t>(rows.size()) && src.size(1) == y.size(1),
            "scatter_add_rows: src must be [", rows.size(), ", ", y.size(1),
            "] (one row per entry of rows), got ", src.describe());
  if (!rows.empty())
    ops::embedding_backward(row_ids(rows, y.size(0), y.device(), "scatter_add_rows"), src, y);
}

Tensor row_block(const Tensor& x, std::int64_t first, std::int64_t count) {
  check_matrix(x, "row_block", "x");
  DTP_CHECK(first >= 0 && count >= 0 && first + count <= x.size(0), "row_block: rows [", first,
            ", ", first + count, ") are outside x's ", x.size(0), " rows");
  return x.flatten().slice(first * x.size(1), count * x.size(1)).view({count, x.size(1)});
}

}  // namespace dtp::ch06
