// The trace files of `dtp train`: one process per rank, and the merge of the
// parts that the processes of an mpiexec run write.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "dtp/error.h"
#include "dtp/trace.h"

namespace dtp {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A finished trace file holding one span of @p rank on @p lane.
void write_part(const std::string& path, int rank, int lane, bool finish = true) {
  trace::ChromeTraceFile file(path);
  file.append({trace::Span{"step", "compute", rank, lane, 10, 30}});
  if (finish) file.finish();
}

TEST(TraceFile, EachRankIsAProcessWithItsOwnAndItsCommThread) {
  trace::enable();
  trace::disable();
  const std::string path = ::testing::TempDir() + "dtp_trace_ranks.json";
  trace::ChromeTraceFile file(path);
  file.append({{"forward", "compute", 0, 0, 1, 2}, {"all_reduce", "comm", 1, 1, 2.5, 4}});
  file.finish();
  const std::string text = read_text(path);
  EXPECT_NE(
      text.find(
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"rank 1\"}}"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{"
                      "\"name\":\"rank 1 comm\"}}"),
            std::string::npos)
      << text;
  // Times are on the wall clock: the origin of enable() plus the span's time.
  char expected[96];
  std::snprintf(expected, sizeof expected, "\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":1.500}",
                trace::origin_unix_us() + 2.5);
  EXPECT_NE(text.find(expected), std::string::npos) << "wanted " << expected << " in\n" << text;
  EXPECT_EQ(count(text, "\"ph\":\"X\""), 2u);
  EXPECT_EQ(text.find("\"name\":\"dtp\""), std::string::npos) << "no end-marker event: " << text;
  EXPECT_EQ(text.substr(text.size() - 5), "}\n]}\n") << text;
  std::remove(path.c_str());
}

TEST(TraceFile, MergeAppendsEveryFinishedPartAndDeletesIt) {
  const std::string into = ::testing::TempDir() + "dtp_trace_merge.json";
  write_part(into, 0, 0);
  write_part(into + ".part1", 1, 0);
  write_part(into + ".part2", 2, 1);
  const auto unfinished = trace::merge_chrome_traces(into, {into + ".part1", into + ".part2"}, 5);
  EXPECT_TRUE(unfinished.empty());
  const std::string text = read_text(into);
  EXPECT_EQ(count(text, "\"ph\":\"X\""), 3u) << text;
  for (const char* name :
       {"\"name\":\"rank 0\"", "\"name\":\"rank 1\"", "\"name\":\"rank 2 comm\""})
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from\n" << text;
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 5), "}\n]}\n") << text;
  EXPECT_EQ(text.find("}\n{"), std::string::npos) << "events must be comma-separated:\n" << text;
  EXPECT_FALSE(exists(into + ".part1") || exists(into + ".part2")) << "merged parts are deleted";
  std::remove(into.c_str());
}

TEST(TraceFile, MergeWaitsForAPartBeingWrittenAndNamesOneThatNeverFinishes) {
  const std::string into = ::testing::TempDir() + "dtp_trace_wait.json";
  const std::string late = into + ".part1", missing = into + ".part2";
  std::remove(missing.c_str());
  write_part(into, 0, 0);
  // Rank 1's process is still writing when the merge starts.
  std::thread writer([&] {
    trace::ChromeTraceFile file(late);
    file.append({trace::Span{"step", "compute", 1, 0, 10, 30}});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    file.finish();
  });
  const auto unfinished = trace::merge_chrome_traces(into, {late, missing}, 1.0);
  writer.join();
  ASSERT_EQ(unfinished.size(), 1u);
  EXPECT_EQ(unfinished[0], missing);
  const std::string text = read_text(into);
  EXPECT_EQ(count(text, "\"ph\":\"X\""), 2u) << "rank 1's late part must be merged:\n" << text;
  std::remove(into.c_str());
}

TEST(TraceFile, MergeIntoAnUnfinishedTraceIsRefusedByName) {
  const std::string into = ::testing::TempDir() + "dtp_trace_unfinished.json";
  write_part(into, 0, 0, /*finish=*/false);
  try {
    trace::merge_chrome_traces(into, {}, 0);
    FAIL() << "merging into a trace without its closing must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + into + "' is not a finished DTP trace file"),
              std::string::npos)
        << e.what();
  }
  std::remove(into.c_str());
}

}  // namespace
}  // namespace dtp
