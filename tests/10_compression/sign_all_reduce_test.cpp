// Puzzle 10.2: sign compression with error feedback. Several steps on
// worlds of 1 to 4 ranks against the checker's own replay of the
// recurrence (same order of operations, so bit for bit): every rank's x
// after all_reduce and its residual after every step; the error-feedback
// identity; the bytes of the two all-gathers; replicas bitwise equal.
// Every x is made on the rank's device (comm.device()).
#include "compression_checks.h"

namespace dtp::testing::compression {
namespace {

constexpr std::int64_t kLength = 70;  // two full words of signs and 6 bits of a third
constexpr int kSteps = 4;

using SignInputs = std::vector<std::vector<std::vector<double>>>;  // [step][rank][element]

/// Rank r's x at step k: normal values times (r + 1), and at step 0 exact
/// zeros at every 9th element from 4, where v = x is 0 (sign(0) = +1).
SignInputs sign_inputs(int world, std::int64_t n, int steps, DType dtype) {
  SignInputs inputs(static_cast<std::size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    for (int r = 0; r < world; ++r) {
      Rng rng(Rng::derive(77, static_cast<std::uint64_t>(16 * k + r)));
      std::vector<double> x;
      for (std::int64_t i = 0; i < n; ++i)
        x.push_back(k == 0 && i % 9 == 4 ? 0.0 : in_dtype(dtype, (r + 1) * rng.normal()));
      inputs[static_cast<std::size_t>(k)].push_back(x);
    }
  }
  return inputs;
}

/// What one rank saw over the steps.
struct RankRun {
  std::vector<double> initial_residual;
  std::vector<std::vector<double>> outputs, residuals;  // [step]
  std::vector<CommStats> before, after;                 // around each all_reduce
};

RankRun run_steps(Comm& comm, const SignInputs& inputs, DType dtype) {
  const auto n = static_cast<std::int64_t>(inputs[0][0].size());
  RankRun run;
  dtp::ch10::SignAllReduce reducer(comm, n, dtype);
  run.initial_residual = reducer.residual().to_vector();
  for (const auto& step : inputs) {
    Tensor x =
        Tensor::from_values(step[static_cast<std::size_t>(comm.rank())], dtype, comm.device());
    run.before.push_back(comm.stats());
    reducer.all_reduce(x);
    run.after.push_back(comm.stats());
    run.outputs.push_back(x.to_vector());
    run.residuals.push_back(reducer.residual().to_vector());
  }
  return run;
}

std::string run_text(int world, std::int64_t n, DType dtype, int steps = kSteps) {
  std::ostringstream out;
  out << "SignAllReduce on " << world << " rank(s), " << n << " " << dtype_name(dtype)
      << " values, " << steps << " steps";
  return out.str();
}

/// Why a wrong x or residual at @p step looks the way it does.
std::string why_wrong(const SignInputs& inputs, DType dtype, int step, int rank, bool output,
                      const std::vector<double>& got, std::int64_t element) {
  const std::vector<double>& given =
      inputs[static_cast<std::size_t>(step)][static_cast<std::size_t>(rank)];
  if (output && std::equal(got.begin(), got.end(), given.begin(), same_bits))
    return "x is what this step handed in: the average never reached x (computed on a host copy "
           "and not copied back with x.copy_from?)";
  for (SignMistake mistake : sign_mistakes()) {
    const SignStep alt =
        replay_sign_all_reduce(inputs, dtype, mistake)[static_cast<std::size_t>(step)];
    const std::vector<double>& theirs =
        output ? alt.output : alt.residuals[static_cast<std::size_t>(rank)];
    if (std::equal(got.begin(), got.end(), theirs.begin(), same_bits)) return describe(mistake);
  }
  const SignStep right = replay_sign_all_reduce(inputs, dtype)[static_cast<std::size_t>(step)];
  const auto i = static_cast<std::size_t>(element);
  const std::vector<double>& v = right.v[static_cast<std::size_t>(rank)];
  if (output) {
    // c_r = v - residual: this rank's own compressed vector.
    bool own = true;
    for (std::size_t j = 0; j < got.size(); ++j)
      own = own &&
            same_bits(got[j],
                      in_dtype(dtype, v[j] - right.residuals[static_cast<std::size_t>(rank)][j]));
    if (own && inputs[0].size() > 1)
      return "this rank's own c alone: add every rank's c (from the all-gathers) and divide by N";
  }
  for (const auto& rank_v : right.v)
    if (rank_v[i] == 0) return "v is 0 here on some rank: sign(0) must be +1 (its bit set)";
  const double expected =
      output ? right.output[i] : right.residuals[static_cast<std::size_t>(rank)][i];
  const double world = static_cast<double>(inputs[0].size());
  if (std::fabs(got[i] - expected) <= 8 * (world + 1) * unit_roundoff(dtype) * std::fabs(expected))
    return "right up to rounding: keep the contract's order (s = (|v_0| + |v_1| + ...) / numel; x "
           "= (c_0 + c_1 + ...) / N, divided, not multiplied by 1/N), each step in x's dtype";
  return "";
}

/// "" when @p got equals @p expected bit for bit; else the first element that differs.
std::string compare_step(const SignInputs& inputs, DType dtype, int step, int rank, bool output,
                         const std::vector<double>& expected, const std::vector<double>& got) {
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < expected.size() && i < got.size(); ++i)
    if (!same_bits(expected[i], got[i]) && wrong++ == 0) first = static_cast<std::int64_t>(i);
  if (got.size() != expected.size())
    return "rank " + std::to_string(rank) + ", step " + std::to_string(step) + ": " +
           (output ? "x" : "the residual") + " has " + std::to_string(got.size()) +
           " elements, expected " + std::to_string(expected.size());
  if (wrong == 0) return "";
  const auto i = static_cast<std::size_t>(first);
  const std::string why = why_wrong(inputs, dtype, step, rank, output, got, first);
  std::ostringstream out;
  out << "rank " << rank << ", step " << step << ", element " << first << ": "
      << (output ? "x after all_reduce" : "residual() after all_reduce") << " expected "
      << text(expected[i]) << ", got " << text(got[i]) << " (" << wrong << " of " << got.size()
      << " elements differ)" << (why.empty() ? "" : ": ") << why;
  return out.str();
}

/// Checks every step of one rank against the replay: x, then the residual.
std::string check_against_replay(Comm& comm, const SignInputs& inputs, DType dtype) {
  const RankRun run = run_steps(comm, inputs, dtype);
  const std::vector<SignStep> replay = replay_sign_all_reduce(inputs, dtype);
  const int rank = comm.rank();
  for (double e : run.initial_residual)
    if (e != 0)
      return "rank " + std::to_string(rank) + ": residual() before the first step holds " +
             text(e) + ": it starts at 0";
  for (int k = 0; k < static_cast<int>(inputs.size()); ++k) {
    const SignStep& want = replay[static_cast<std::size_t>(k)];
    std::string failure = compare_step(inputs, dtype, k, rank, true, want.output,
                                       run.outputs[static_cast<std::size_t>(k)]);
    if (failure.empty())
      failure = compare_step(inputs, dtype, k, rank, false,
                             want.residuals[static_cast<std::size_t>(rank)],
                             run.residuals[static_cast<std::size_t>(k)]);
    if (!failure.empty()) return failure;
  }
  return "";
}

TEST(Puzzle10_2_sign_all_reduce, MatchesTheReplayBitForBit) {
  const DType dtype = data_dtype();
  for (int world : chapter_worlds()) {
    const SignInputs inputs = sign_inputs(world, kLength, kSteps, dtype);
    run_and_check(run_text(world, kLength, dtype), world,
                  [&](Comm& comm) { return check_against_replay(comm, inputs, dtype); });
    if (stop_sweep()) return;
  }
}

// One value, a word less one, a word, a word and one, two words and one.
TEST(Puzzle10_2_sign_all_reduce, LengthsAroundAWord) {
  const DType dtype = data_dtype();
  const int world = std::min(3, chapter_worlds().back());
  for (std::int64_t n : {1, 31, 32, 33, 65}) {
    const SignInputs inputs = sign_inputs(world, n, 2, dtype);
    run_and_check(run_text(world, n, dtype, 2), world,
                  [&](Comm& comm) { return check_against_replay(comm, inputs, dtype); });
    if (stop_sweep()) return;
  }
}

// v = (0, 1, -1, 0, 2, 0, ...) on one rank: s = mean |v|, and every 0 is sent as +s.
TEST(Puzzle10_2_sign_all_reduce, SignOfZeroIsPlus) {
  const DType dtype = data_dtype();
  SignInputs inputs(1, std::vector<std::vector<double>>(1));
  for (int i = 0; i < 33; ++i) inputs[0][0].push_back(i % 3 == 0 ? 0.0 : i % 3 == 1 ? 1.0 : -1.0);
  run_and_check("SignAllReduce on 1 rank, one step of 33 values of which 11 are 0", 1,
                [&](Comm& comm) { return check_against_replay(comm, inputs, dtype); });
}

// Per step: two all-gathers, of N * packed_words(n, 1) words and N scales.
TEST(Puzzle10_2_sign_all_reduce, SendsSignsAndScalesOnly) {
  const DType dtype = data_dtype();
  const auto elem = static_cast<std::int64_t>(dtype_size(dtype));
  for (int world : chapter_worlds()) {
    const SignInputs inputs = sign_inputs(world, kLength, kSteps, dtype);
    run_and_check(run_text(world, kLength, dtype), world, [&](Comm& comm) -> std::string {
      const RankRun run = run_steps(comm, inputs, dtype);
      const std::int64_t words = dtp::ch10::packed_words(kLength, 1);
      const std::int64_t expected = world * (4 * words + elem);
      for (int k = 0; k < kSteps; ++k) {
        const CommStats& before = run.before[static_cast<std::size_t>(k)];
        const CommStats& after = run.after[static_cast<std::size_t>(k)];
        const auto calls = calls_between(before, after);
        const std::int64_t bytes = after.collective_bytes - before.collective_bytes;
        const std::map<std::string, std::int64_t> two_gathers = {{"all_gather", 2}};
        if (calls == two_gathers && bytes == expected) continue;
        std::ostringstream out;
        out << "rank " << comm.rank() << ", step " << k
            << ": expected all_gather x2 (signs, then s) "
            << "moving N * (4 * packed_words(" << kLength << ", 1) + " << elem << ") = " << world
            << " * (4 * " << words << " + " << elem << ") = " << expected
            << " bytes (all_gather counts its full buffer), got " << calls_text(calls) << " moving "
            << bytes << " bytes";
        if (bytes == world * kLength * elem || bytes == kLength * elem)
          out << ": the values travelled whole, not as signs";
        else if (bytes == world * (4 * kLength + elem))
          out << ": one sign per word; pack 32 signs into each word";
        return out.str();
      }
      return "";
    });
    if (stop_sweep()) return;
  }
}

std::string replicas_agree(Comm& comm, const std::vector<double>& mine, int step) {
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor all = Tensor::empty(Shape{n * comm.size()}, DType::f64, comm.device());
  comm.all_gather(Tensor::from_values(mine, DType::f64, comm.device()), all);
  const std::vector<double> everyone = all.to_vector();
  for (int r = 0; r < comm.size(); ++r)
    for (std::int64_t i = 0; i < n; ++i) {
      const double theirs = everyone[static_cast<std::size_t>(r * n + i)];
      if (!same_bits(theirs, mine[static_cast<std::size_t>(i)]))
        return "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(step) +
               ", element " + std::to_string(i) + ": x is " +
               text(mine[static_cast<std::size_t>(i)]) + " here but " + text(theirs) + " on rank " +
               std::to_string(r) +
               ": the replicas drifted apart (add the c's in rank order on every rank)";
    }
  return "";
}

TEST(Puzzle10_2_sign_all_reduce, ReplicasHoldTheSameBits) {
  const DType dtype = data_dtype();
  for (int world : chapter_worlds()) {
    if (world == 1) continue;
    const SignInputs inputs = sign_inputs(world, kLength, kSteps, dtype);
    run_and_check(run_text(world, kLength, dtype), world, [&](Comm& comm) -> std::string {
      const RankRun run = run_steps(comm, inputs, dtype);
      std::string failure;
      for (int k = 0; k < kSteps; ++k) {  // every rank makes every all-gather
        const std::string found = replicas_agree(comm, run.outputs[static_cast<std::size_t>(k)], k);
        if (failure.empty()) failure = found;
      }
      return failure;
    });
    if (stop_sweep()) return;
  }
}

// What every rank sent plus what it holds back is what it was given:
//   sum over steps of N x_out + sum over ranks of the final residual
//     = sum over ranks and steps of x_in
// (on one rank: the sum of its c's plus its residual is the sum of its x's).
// Exact in real numbers; here each step rounds v, the residual, the sum of
// N c's and the division by N, all within u M (M the largest magnitude the
// replay meets, u the dtype's unit roundoff), and N x_out scales the last
// two by N: the identity holds to 2 K N (N^2 + 3) u M.
TEST(Puzzle10_2_sign_all_reduce, ErrorFeedbackLosesNothing) {
  const DType dtype = data_dtype();
  for (int world : chapter_worlds()) {
    const SignInputs inputs = sign_inputs(world, kLength, kSteps, dtype);
    double largest = 0;
    for (const SignStep& step : replay_sign_all_reduce(inputs, dtype)) {
      for (double value : step.output) largest = std::max(largest, std::fabs(value) * world);
      for (const auto& rank_values : step.v)
        for (double value : rank_values) largest = std::max(largest, std::fabs(value));
      for (const auto& rank_values : step.residuals)
        for (double value : rank_values) largest = std::max(largest, std::fabs(value));
    }
    const double tolerance =
        2.0 * kSteps * world * (world * world + 3) * unit_roundoff(dtype) * largest;
    run_and_check(run_text(world, kLength, dtype), world, [&](Comm& comm) -> std::string {
      const RankRun run = run_steps(comm, inputs, dtype);
      Tensor residuals = Tensor::empty(Shape{kLength * world}, DType::f64, comm.device());
      comm.all_gather(Tensor::from_values(run.residuals.back(), DType::f64, comm.device()),
                      residuals);
      const std::vector<double> held = residuals.to_vector();
      for (std::int64_t i = 0; i < kLength; ++i) {
        double sent = 0, given = 0, kept = 0;
        for (int k = 0; k < kSteps; ++k) {
          sent += world * run.outputs[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
          for (int r = 0; r < world; ++r)
            given += inputs[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)]
                           [static_cast<std::size_t>(i)];
        }
        for (int r = 0; r < world; ++r) kept += held[static_cast<std::size_t>(r * kLength + i)];
        if (std::fabs(sent + kept - given) <= tolerance) continue;
        std::ostringstream out;
        out << "rank " << comm.rank() << ", after " << kSteps << " steps, element " << i
            << ": sent (sum of N x_out) " << text(sent) << " + kept (sum of the ranks' residuals) "
            << text(kept) << " = " << text(sent + kept) << ", expected the sum of the inputs "
            << text(given) << " (within " << text(tolerance)
            << "): either x_out is not the mean of the c's or the residual does not hold what "
               "compression lost (residual = v - c, v = x + the old residual)";
        return out.str();
      }
      return "";
    });
    if (stop_sweep()) return;
  }
}

TEST(Puzzle10_2_sign_all_reduce, BadArgumentsAreRefused) {
  const DType dtype = data_dtype();
  run_and_check("SignAllReduce with bad arguments", 1, [&](Comm& comm) -> std::string {
    std::string message = dtp_error_of([&] { dtp::ch10::SignAllReduce(comm, 8, DType::i32); });
    if (!refused(message))
      return "SignAllReduce(comm, 8, i32) must throw a dtp::Error (f32 or f64 only), got: " +
             message;
    message = dtp_error_of([&] { dtp::ch10::SignAllReduce(comm, 0, dtype); });
    if (!refused(message))
      return "SignAllReduce(comm, 0, " + std::string(dtype_name(dtype)) +
             ") must throw a dtp::Error (numel >= 1), got: " + message;
    message = dtp_error_of([&] {
      dtp::ch10::SignAllReduce reducer(comm, 8, dtype);
      Tensor x = Tensor::zeros(Shape{7}, dtype, comm.device());
      reducer.all_reduce(x);
    });
    if (!refused(message))
      return "all_reduce of 7 values on a SignAllReduce of 8 must throw a dtp::Error, got: " +
             message;
    return "";
  });
}

}  // namespace
}  // namespace dtp::testing::compression
