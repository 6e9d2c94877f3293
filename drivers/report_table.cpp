// The per-rank report of a step, as numbers and as the aligned table
// `dtp train` prints under a kept step.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "drivers/strategy.h"
#include "dtp/error.h"

namespace dtp::drivers {
namespace {

std::string cell(double value, ColumnUnit unit) {
  if (std::isnan(value)) return "-";
  char text[48];
  switch (unit) {
    case ColumnUnit::count:
      std::snprintf(text, sizeof text, "%.0f", value);
      break;
    case ColumnUnit::mebibytes:
      std::snprintf(text, sizeof text, "%.3f", value / (1024.0 * 1024.0));
      break;
    case ColumnUnit::milliseconds:
      std::snprintf(text, sizeof text, "%.2f", value * 1e3);
      break;
    case ColumnUnit::number:
      std::snprintf(text, sizeof text, "%.4f", value);
      break;
  }
  return text;
}

}  // namespace

double ReportTable::at(std::size_t row, const std::string& heading) const {
  DTP_CHECK(row < rows.size(), "ReportTable: no row ", row, " (the table has ", rows.size(), ")");
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c].heading == heading) {
      DTP_CHECK(c < rows[row].values.size(), "ReportTable: row ", row, " has no value for '",
                heading, "'");
      return rows[row].values[c];
    }
  std::string headings;
  for (const ReportColumn& c : columns) headings += (headings.empty() ? "" : ", ") + c.heading;
  DTP_CHECK(false, "ReportTable: no column '", heading, "' (it has ", headings, ")");
  return 0;
}

std::string ReportTable::str() const {
  if (rows.empty()) return "";
  // Every cell as text first, then each column as wide as its widest cell:
  // the labels left-aligned, the numbers right-aligned.
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> headings = {label_heading};
  for (const ReportColumn& c : columns)
    headings.push_back(c.heading + (c.unit == ColumnUnit::mebibytes      ? " MiB"
                                    : c.unit == ColumnUnit::milliseconds ? " ms"
                                                                         : ""));
  cells.push_back(headings);
  for (const Row& row : rows) {
    std::vector<std::string> line = {row.label};
    for (std::size_t c = 0; c < columns.size(); ++c)
      line.push_back(c < row.values.size() ? cell(row.values[c], columns[c].unit) : "");
    cells.push_back(line);
  }
  std::vector<std::size_t> width(headings.size(), 0);
  for (const auto& line : cells)
    for (std::size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  std::string out;
  for (const auto& line : cells) {
    std::string text = "    ";
    for (std::size_t c = 0; c < line.size(); ++c) {
      const std::string pad(width[c] - line[c].size(), ' ');
      text += c == 0 ? line[c] + pad : "  " + pad + line[c];
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  }
  return out;
}

}  // namespace dtp::drivers
