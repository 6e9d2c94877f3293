// Puzzles 5.3-5.6: the schedules. Each must be valid for p = 1..8 and
// m = 1..3p (the verifier runs it), have the lesson's bubble on the
// simulated clock (F = 1, B = 2; zb-h1: F = B = W = 1), and hold no more
// micro-batches than the lesson says (interleaved: exactly its peak).
#include <cmath>

#include "pipeline_checks.h"

namespace dtp::testing::ch05 {
namespace {

// Runs make() on every (p, m) and reports the first few failures.
template <typename Make, typename Check>
void sweep(const std::string& name, Make make, Check check, int step_m = 1) {
  int failures = 0;
  for (int p = 1; p <= 8 && failures < 3; ++p) {
    for (int m = step_m; m <= 3 * p && failures < 3; m += step_m) {
      Schedule s;
      try {
        s = make(p, m);
      } catch (const dtp::NotSolved&) {
        throw;
      } catch (const std::exception& e) {
        ADD_FAILURE() << call(name, p, m) << " threw: " << e.what();
        ++failures;
        continue;
      }
      const ScheduleReport report = simulate_schedule(s);
      std::string problem =
          report.ok() ? check(s, report, p, m) : "the verifier rejects it: " + report.problem;
      if (!problem.empty()) {
        ADD_FAILURE() << call(name, p, m) << ": " << problem << chart_of(s, report)
                      << "\n    (draw yours: ./dtp schedule --kind " << name << " --stages " << p
                      << " --microbatches " << m << ")";
        ++failures;
      }
    }
  }
}

std::string bubble_is(const ScheduleReport& report, double expected, const std::string& formula) {
  if (std::fabs(report.bubble_fraction - expected) <= 1e-12) return "";
  return "bubble " + number(report.bubble_fraction) + " (makespan " + number(report.makespan) +
         "), expected " + formula + " = " + number(expected);
}

TEST(Puzzle5_3_afab, EveryScheduleIsValidWithTheGPipeBubbleAndAllMicroBatchesAlive) {
  sweep("afab", afab_schedule, [](const Schedule& s, const ScheduleReport& r, int p, int m) {
    std::string problem = check_shape(s, "the schedule", p, m, 1, false);
    if (problem.empty()) problem = bubble_is(r, (p - 1.0) / (m + p - 1.0), "(p-1)/(m+p-1)");
    for (int rank = 0; rank < p && problem.empty(); ++rank)
      if (r.peak_alive[static_cast<std::size_t>(rank)] != m)
        problem = "rank " + std::to_string(rank) + " holds at most " +
                  std::to_string(r.peak_alive[static_cast<std::size_t>(rank)]) +
                  " micro-batches; AFAB runs all m = " + std::to_string(m) +
                  " forwards before any backward";
    return problem;
  });
}

TEST(Puzzle5_3_afab, NoStagesOrNoMicroBatchesIsAnError) {
  EXPECT_THROW(afab_schedule(0, 4), dtp::Error)
      << "afab_schedule(0, 4): start from empty_schedule, which checks";
  EXPECT_THROW(afab_schedule(4, 0), dtp::Error)
      << "afab_schedule(4, 0): start from empty_schedule, which checks";
}

TEST(Puzzle5_4_one_f_one_b, EveryScheduleIsValidWithTheGPipeBubbleAndAtMostPMinusRAlive) {
  sweep("1f1b", one_f_one_b_schedule, [](const Schedule& s, const ScheduleReport& r, int p, int m) {
    std::string problem = check_shape(s, "the schedule", p, m, 1, false);
    if (problem.empty()) {
      problem = bubble_is(r, (p - 1.0) / (m + p - 1.0), "(p-1)/(m+p-1), AFAB's");
      if (!problem.empty() && r.bubble_fraction > (p - 1.0) / (m + p - 1.0))
        problem +=
            " (the pipeline stalls: too few warm-up forwards? rank r needs min(p - r - 1, m))";
    }
    for (int rank = 0; rank < p && problem.empty(); ++rank) {
      const int peak = r.peak_alive[static_cast<std::size_t>(rank)], limit = std::min(p - rank, m);
      if (peak > limit)
        problem = "rank " + std::to_string(rank) + " holds " + std::to_string(peak) +
                  " micro-batches at once; 1F1B " +
                  "holds at most min(p - r, m) = " + std::to_string(limit) +
                  " (too many warm-up forwards: rank r needs p - r - 1)";
    }
    return problem;
  });
}

TEST(Puzzle5_4_one_f_one_b, NoStagesOrNoMicroBatchesIsAnError) {
  EXPECT_THROW(one_f_one_b_schedule(0, 4), dtp::Error);
  EXPECT_THROW(one_f_one_b_schedule(4, 0), dtp::Error);
}

TEST(Puzzle5_5_interleaved, EveryScheduleIsValidWithTheInterleavedBubbleAndPeak) {
  for (int v : {2, 3}) {
    int failures = 0;
    for (int p = 2; p <= 8 && failures < 3; ++p) {
      for (int m = p; m <= 3 * p && failures < 3; m += p) {
        const Schedule s = interleaved_schedule(p, m, v);
        const ScheduleReport r = simulate_schedule(s);
        std::string problem = check_shape(s, "the schedule", p, m, v, false);
        if (problem.empty() && !r.ok()) problem = "the verifier rejects it: " + r.problem;
        if (problem.empty())
          problem = bubble_is(r, (p - 1.0) / (v * m + p - 1.0), "(p-1)/(v m+p-1)");
        // A deeper warm-up keeps the bubble and holds more activations.
        for (int rank = 0; rank < p && problem.empty(); ++rank) {
          const int warmup = 2 * (p - rank - 1) + (v - 1) * p;
          const int peak = r.peak_alive[static_cast<std::size_t>(rank)];
          const int want = std::min(warmup + 1, m * v);
          if (peak != want)
            problem = "rank " + std::to_string(rank) + " holds at most " + std::to_string(peak) +
                      " (micro-batch, chunk) pairs at once; the lesson's interleaved 1F1B holds "
                      "min(2(p-r-1) + (v-1)p + 1, m v) = " +
                      std::to_string(want) + ": " +
                      (peak > want ? "too many warm-up forwards, the same bubble for more memory"
                                   : "fewer warm-up forwards than the contract's") +
                      " (rank r runs min(2(p-r-1) + (v-1)p, m v) = " +
                      std::to_string(std::min(warmup, m * v)) + " before its first backward)";
        }
        if (!problem.empty()) {
          ADD_FAILURE() << call("interleaved", p, m, v) << ": " << problem << chart_of(s, r)
                        << "\n    (draw yours: ./dtp schedule --kind interleaved --stages " << p
                        << " --microbatches " << m << " --chunks " << v << ")";
          ++failures;
        }
      }
    }
  }
}

TEST(Puzzle5_5_interleaved, ConditionsItNeedsAreErrorsNamingTheNumbers) {
  auto expect_error = [](int p, int m, int v, const std::vector<std::string>& words) {
    try {
      interleaved_schedule(p, m, v);
      ADD_FAILURE() << call("interleaved", p, m, v)
                    << " returned a schedule; expected a dtp::Error";
    } catch (const dtp::NotSolved&) {
      throw;
    } catch (const dtp::Error& e) {
      for (const std::string& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << call("interleaved", p, m, v) << "'s error should name " << w
            << "; it says: " << e.what();
    }
  };
  expect_error(4, 6, 2, {"6", "4"});  // m not a multiple of p
  expect_error(3, 4, 2, {"4", "3"});
  expect_error(4, 8, 1, {"1"});  // one chunk is 1F1B
  expect_error(1, 4, 2, {"1"});  // nobody to interleave with
  EXPECT_THROW(interleaved_schedule(0, 4, 2), dtp::Error);
}

TEST(Puzzle5_6_zb_h1, EveryScheduleIsValidWithAtMostTheLessonsBubbleAndAtMostPAlive) {
  sweep("zb-h1", zb_h1_schedule, [](const Schedule& s, const ScheduleReport& r, int p, int m) {
    std::string problem = check_shape(s, "the schedule", p, m, 1, true);
    // F = B = W = 1: idle per rank (p-1) + max(0, p-m), a third of 1F1B's 3(p-1) when m >= p.
    const double idle = (p - 1.0) + std::max(0, p - m);
    const double bound = idle / (3.0 * m + idle);
    if (problem.empty() && r.bubble_fraction > bound + 1e-12)
      problem = "bubble " + number(r.bubble_fraction) + " (makespan " + number(r.makespan) +
                ") is above the bound " + number(bound) +
                " ((p-1) + max(0, p-m) idle units per rank; 1F1B's split schedule idles 3(p-1)): " +
                "are the W's held back so that every B runs as early as in 1F1B?";
    for (int rank = 0; rank < p && problem.empty(); ++rank) {
      const int peak = r.peak_alive[static_cast<std::size_t>(rank)];
      if (peak > std::min(p, m))
        problem = "rank " + std::to_string(rank) + " holds " + std::to_string(peak) +
                  " micro-batches at once (until their W); ZB-H1 keeps 1F1B's peak, at most p = " +
                  std::to_string(p);
    }
    return problem;
  });
}

TEST(Puzzle5_6_zb_h1, NoStagesOrNoMicroBatchesIsAnError) {
  EXPECT_THROW(zb_h1_schedule(0, 4), dtp::Error);
  EXPECT_THROW(zb_h1_schedule(4, 0), dtp::Error);
}

}  // namespace
}  // namespace dtp::testing::ch05
