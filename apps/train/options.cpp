// dtp-train's flags: parsing with ranges, then the checks between flags.
#include "train/options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include "dtp/device.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp_cli.h"

namespace dtp::train_app {

const char* const kUsage = R"(Usage: dtp train [OPTIONS]

Trains a small GPT on one device (or on data-parallel ranks with --strategy ddp
or zero, tensor-parallel ones with --strategy tp, pipeline stages with
--strategy pp, sequence shards with --strategy sp, expert shards with
--strategy ep, in bf16 or f16 with --precision), shows a progress line (loss, tokens/s, time left) and a summary.

Run:
  --device cpu|cuda[:k]   where to train (default cpu)
  --strategy NAME         how to train: single (default), ddp (chapter 02),
                          zero (chapter 03), tp (chapter 04), pp (chapter 05),
                          sp or ep (chapter 06)
  --impl puzzles|reference
                          whose code a strategy with puzzles runs: yours in
                          puzzles/ (default) or the reference solution
                          (bin/dtp-train-reference, started for you)
  --steps K               optimizer steps, 1 to 10^9 (default 300)
  --batch B               sequences per step, the global batch, 1 to 1048576 (default 16)
  --seq T                 tokens per sequence, 1 to 65536 (default 64)
  --data FILE             train on the bytes of a text file (vocabulary 256);
                          default: the synthetic phrase stream
  --seed N                seeds weights, data and sampling, 0 to 2^63-1 (default 1234)
  --trace FILE            write a Chrome/Perfetto trace of the run, written as it
                          runs: each rank a process, its communication thread a
                          second track. Under mpiexec each process writes
                          FILE.partK and rank 0 merges them into FILE. Cost:
                          none measurable on the 2-core test machine (the run
                          was no slower with it)
  --json FILE             write a JSON-lines log (config, one line per step, summary)
  --log-every N           keep a line every N steps (default: about ten per run);
                          on a terminal a line updates in place in between

Checkpoints (every strategy; the format: runtime/include/dtp/checkpoint.h;
under zero, tp, pp and ep rank 0 gathers the shards into one file of the
single-device layout, which --load reads under any strategy):
  --save FILE             at the end, write what the run trains (the parameters;
                          under LoRA the adapters alone), the optimizer state,
                          the step and these settings to FILE (written to
                          FILE.tmp and renamed: an interrupted save leaves the
                          old FILE as it was)
  --resume FILE           continue the run that saved FILE, from its step to
                          --steps: the same result, bit for bit, as the run
                          that was never stopped. Every setting but --steps
                          must be the saved run's, --world and the strategy's
                          flags too (the error lists any that differ); under
                          --precision the f32 masters and the loss scale go on
  --load FILE             start from FILE's parameters (a new run: fresh
                          optimizer, step 0): fine-tuning a pretrained model,
                          on other data with another --seed. A file of another
                          float dtype is cast; under --precision the f32
                          masters start from its values, unrounded
  --stop-after K          stop after step K, 1 to --steps: train a run of
                          --steps in slices (--save, then --resume; under LoRA
                          --load BASE --resume FILE)

LoRA (chapter 08):
  --lora-rank R           fine-tune low-rank adapters on a frozen model (rank R,
                          1 to 4096): start from --load FILE's parameters, train
                          only the adapters; with --world N data parallel (8.4);
                          --save writes the adapters and their optimizer state
  --lora-alpha A          the adapters' scale is A / R (default 2R)
  --lora-targets LIST     the Linears of each block that get adapters: a comma
                          list of attn.q, attn.k, attn.v, attn.proj, mlp.fc,
                          mlp.proj, or all (default attn.q,attn.v)
  --save-merged FILE      at the end, write the merged model (W + (alpha/R) B A in
                          every adapted Linear): a whole model for --load

Mixed precision (chapter 07):
  --precision fp32|bf16|fp16
                          fp32 (default) trains as --dtype says; bf16 and fp16
                          run a 16-bit model with f32 master weights (7.2), on
                          one device or, with --world N, data parallel (7.4)
  --loss-scale dynamic|none|S
                          dynamic: start at 2^16, halve on an overflow (the step
                          is skipped), double after 2000 good steps (7.3); none;
                          or a fixed scale S > 0 (overflows still skip).
                          Default: dynamic for fp16, none for bf16. The log shows
                          the scale and every skipped step
  --reduce-dtype f32|bf16|f16
                          the dtype gradients are averaged in with --world > 1:
                          f32 (default) or the model's

Data parallel (--strategy ddp, chapter 02; --world also for zero):
  --world N               data-parallel ranks, 1 to 1024 (default 2; under mpiexec
                          with DTP_BACKEND=mpi: the number of processes)
  --ddp-mode MODE         naive (2.1), flat (2.2) or bucketed (2.3, default)
  --bucket-mb X           bucket size in MiB for bucketed mode, 0 to 1048576
                          (default: a quarter of the model's gradients, so about
                          4 buckets; 0: one bucket per parameter)
  --accumulate K          micro-batches per optimizer step, 1 to 1048576 (default 1);
                          the global batch must divide by world x K
  A line per rank follows each kept step: its all-reduces, bytes and the
  time its thread waited on communication (exposed, not overlapped).

ZeRO / FSDP (--strategy zero, chapter 03; --world as above):
  --stage S               what each rank keeps only a 1/N shard of, 1 to 3
                          (default 1): 1 the optimizer state (3.1), 2 also the
                          gradients (3.2), 3 also the parameters (3.3, FSDP)
  --prefetch              with --stage 3: gather the next unit's parameters while
                          the current one computes (3.4)
  --offload               with --stage 1: keep the optimizer state and its update
                          in host memory (3.5)
  A line per rank follows each kept step: its peak memory per category (what
  a DDP rank would hold in parentheses) and the bytes its collectives moved.

Tensor parallel (--strategy tp, chapter 04):
  --tp T                  ranks per tensor-parallel group, 1 to 1024 (default 2);
                          heads, vocabulary and MLP width must divide by T
  --dp D                  data-parallel groups, 1 to 1024 (default 1); the world
                          is D x T ranks (under mpiexec: as many processes)
  --sequence-parallel     also split the LayerNorm and residual activations
                          by tokens (Megatron sequence parallelism, 4.7)
  A line per rank follows each kept step: its parameter bytes, its peak
  activation bytes and the bytes its collectives moved.

Pipeline parallel (--strategy pp, chapter 05):
  --pp P                  pipeline stages, 1 to 1024 (default 2); the model's
                          units (embedding, blocks, head) are split over them
  --microbatches M        micro-batches per step, 1 to 4096 (default 4); each
                          data-parallel rank's batch must divide by M
  --schedule KIND         afab, 1f1b (default), interleaved or zb-h1
  --chunks V              model chunks per rank for --schedule interleaved,
                          2 to 64 (default 2); M must be a multiple of P
  --dp D                  pipeline replicas, 1 to 1024 (default 1); the world
                          is P x D ranks, the D ranks of a stage consecutive
  --fsdp                  shard each stage over its D replicas (ZeRO-3, 5.8)
  --balance params|time   split the units by parameters (default) or by their
                          measured forward + backward time
  Each kept step is followed by the step's bubble (simulated clock and wall
  time), a line per rank, and on the first kept step the Gantt chart of
  pipeline 0 as it ran (F = 1, B = 2 on the clock; zb-h1: B = W = 1).

Sequence parallel (--strategy sp, chapter 06):
  --sp N                  ranks that split every sequence's positions, 1 to 1024
                          (default 2; the world); --seq must divide by N (2 N
                          for zigzag); every rank holds the whole model and batch
  --sp-kind KIND          the attention across ranks: ulysses (6.1, default;
                          --heads must divide by N), ring (6.2-6.3), zigzag
                          (6.4, load-balanced ring) or hybrid (6.5)
  --sp-ulysses U          hybrid: ranks per Ulysses group, 1 to 1024 (default 2);
                          U must divide N and --heads; ring attention across
                          the N / U groups
  A line per rank follows each kept step: its positions, its activation
  peak, the bytes it moved and (ring kinds) its attention blocks.

Expert parallel (--strategy ep, chapter 06; --world as above):
  Each of --world ranks trains its slice of the batch and holds 1 / world of
  every block's experts (--moe-experts must divide by --world); tokens travel
  to their experts and back (6.7). Each rank routes its own tokens, so a
  run on N ranks equals one device with --moe-groups N. A line per rank
  follows each kept step: its experts, tokens, dropped choices and bytes.

Model:
  --layers N              transformer blocks, 0 to 256 (default 2)
  --d-model C             width, 1 to 65536 (default 64)
  --heads H               attention heads, 1 to 65536; C must divide by H (default 4)
  --vocab V               vocabulary of the synthetic data, 2 to 1048576 (default 64)
  --attention KIND        naive or flash (default naive)
  --dtype f32|f64         parameter and activation dtype (default f32)
  --moe-experts E         a mixture of E expert MLPs in every block, 0 to 1024
                          (default 0: one dense MLP); single, ddp, zero and ep
  --top-k K               experts per token, 1 to E (default 1)
  --capacity-factor X     expert capacity = ceil(X tokens K / E), above 0 to
                          1024 (default 1.25); choices over it are dropped
  --aux-loss-coef X       weight of the load-balancing loss, 0 to 100
                          (default 0.01)
  --moe-groups G          route each batch's tokens in G equal groups, each with
                          its own capacity and balance loss, 1 to 1024 (default 1)

Optimizer:
  --optimizer NAME        adamw or sgd (default adamw)
  --lr X                  peak learning rate, 1e-12 to 1000 (default 3e-3)
  --warmup N              linear warm-up steps, 0 to 10^9 (default 20)
  --min-lr-ratio X        cosine decay ends at lr * X, 0 to 1 (default 0.1)
  --weight-decay X        decoupled weight decay, 0 to 100 (default 0)
  --momentum X            SGD momentum, 0 to below 1 (default 0.9)
  --clip X                clip gradients to this global norm, 0 to 10^6; 0 disables
                          (default 1)

  -h, --help              this text

Exit status: 0 trained; 1 the run failed; 2 a bad command line; 3 a puzzle
the run needs is not solved yet.
)";

namespace {

std::string range_text(double low, double high) {
  char text[96];
  std::snprintf(text, sizeof text, "[%.15g, %.15g]", low, high);
  return text;
}

// An integer in [low, high], the whole text (no "12x", no " 12", no "1e3").
std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t low,
                       std::int64_t high) {
  const std::string expected = flag + " expects an integer in [" + std::to_string(low) + ", " +
                               std::to_string(high) + "], got '" + text + "'";
  const std::optional<long double> value = cli::parse_integer_text(text);  // the parser every program uses
  if (!value || *value < low || *value > high) throw UsageError{expected};
  return static_cast<std::int64_t>(*value);
}

// Which ends of a range belong to it: [low, high], (low, high] or [low, high).
enum class Ends { closed, open_low, open_high };

// A finite number in the range from low to high, its ends as @p ends says.
double parse_real(const std::string& flag, const std::string& text, double low, double high,
                  Ends ends = Ends::closed) {
  std::string range = range_text(low, high);
  if (ends == Ends::open_low) range.front() = '(';
  if (ends == Ends::open_high) range.back() = ')';
  const std::string expected = flag + " expects a number in " + range + ", got '" + text + "'";
  // Decimal only: strtod would also take " 1", "0x10" (16) and "0x1p-3".
  const std::optional<double> value = cli::parse_real_text(text);
  if (!value) throw UsageError{expected};
  const bool above_low = ends == Ends::open_low ? *value > low : *value >= low;
  const bool below_high = ends == Ends::open_high ? *value < high : *value <= high;
  if (!above_low || !below_high) throw UsageError{expected};
  return *value;
}

template <typename Fn>
auto parse_with(const std::string& flag, const std::string& text, Fn fn) -> decltype(fn(text)) {
  try {
    return fn(text);
  } catch (const dtp::Error& e) {
    throw UsageError{flag + ": " + e.what()};
  }
}

constexpr std::int64_t kMaxSteps = 1000000000;
constexpr std::int64_t kMaxBatch = 1 << 20;
constexpr std::int64_t kMaxSeq = 1 << 16;
constexpr std::int64_t kMaxWidth = 1 << 16;

// Creates (or keeps) @p path to learn now, not after the run, that it cannot
// be written. Appending leaves an existing file as it is until the run.
void check_writable(const std::string& flag, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr)
    throw UsageError{flag + ": cannot write '" + path + "': " + std::strerror(errno)};
  std::fclose(file);
}

// --save must not create FILE before the run (a failed run would leave an
// empty "checkpoint"): check that its folder takes new files instead.
void check_save_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (fs::is_directory(target)) throw UsageError{flag + " expects a file path, got the directory '" + path + "'"};
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(folder))
    throw UsageError{flag + ": the folder '" + folder.string() + "' of '" + path + "' does not exist"};
  if (::access(folder.c_str(), W_OK) != 0)
    throw UsageError{flag + ": cannot write in '" + folder.string() + "': " + std::strerror(errno)};
  // The save writes FILE.tmp first: a folder there would fail it after the run.
  const std::string temporary = path + ".tmp";
  std::error_code error;
  if (fs::exists(temporary, error) && !fs::is_regular_file(temporary, error))
    throw UsageError{flag + " '" + path + "' is written through '" + temporary +
                     "', which exists and is not a file: remove it or save elsewhere"};
}

// Two flags name one file when their paths lead to the same place: "t.json"
// and "./t.json", a link and its target, or two hard links.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) return fs::equivalent(a, b, error);
  const fs::path x = fs::weakly_canonical(fs::absolute(a, error), error);
  const fs::path y = fs::weakly_canonical(fs::absolute(b, error), error);
  return x == y;
}

// No file is both read and written, and no two outputs share a file: the
// run would overwrite its data or checkpoint, or one output the other.
// --save writes FILE.tmp and renames it over FILE at the end, so --save may
// name the --resume or --load file (read first, replaced whole), but its
// FILE.tmp may name nothing else.
void check_files_apart(const Options& o) {
  const TrainConfig& c = o.config;
  struct File {
    std::string flag, path;
    bool output;
  };
  std::vector<File> files;
  auto add = [&files](const std::string& flag, const std::string& path, bool output) {
    if (!path.empty()) files.push_back({flag, path, output});
  };
  add("--data", c.data_path, false);
  add("--resume", c.resume_path, false);
  add("--load", c.load_path, false);
  add("--trace", c.trace_path, true);
  add("--json", c.json_path, true);
  add("--save", c.save_path, true);
  if (!c.save_path.empty()) add("--save's temporary file", c.save_path + ".tmp", true);
  add("--save-merged", o.lora.save_merged_path, true);
  if (!o.lora.save_merged_path.empty()) add("--save-merged's temporary file", o.lora.save_merged_path + ".tmp", true);
  for (std::size_t i = 0; i < files.size(); ++i)
    for (std::size_t j = i + 1; j < files.size(); ++j) {
      const File &a = files[i], &b = files[j];
      if (!a.output && !b.output) continue;  // two inputs may be one file
      const bool save_replaces_input = (!a.output && (b.flag == "--save" || b.flag == "--save-merged")) ||
                                       (!b.output && (a.flag == "--save" || a.flag == "--save-merged"));
      if (a.flag != "--data" && b.flag != "--data" && save_replaces_input) continue;
      if (!same_file(a.path, b.path)) continue;
      const char* why =
          a.output && b.output ? "one output would overwrite the other" : "the run would overwrite a file it reads";
      throw UsageError{a.flag + " '" + a.path + "' and " + b.flag + " '" + b.path + "' are the same file: " + why +
                       "; give each its own file"};
    }
}

// A flag that the run would not use is a mistake in the command line, not
// something to drop without a word.
void check_no_ignored_flags(const Options& o) {
  const TrainConfig& c = o.config;
  auto given = [&o](const char* flag) { return o.given.count(flag) > 0; };
  if (given("--chunks") && o.pp.pipeline.schedule != ch05::ScheduleKind::interleaved)
    throw UsageError{"--chunks sets v of --schedule interleaved; this run's schedule is not interleaved"};
  if (given("--sp-ulysses") && o.sp.kind != ch06::SequenceParallelKind::hybrid)
    throw UsageError{"--sp-ulysses sets the Ulysses group of --sp-kind hybrid; this run's --sp-kind is not hybrid"};
  for (const char* flag : {"--top-k", "--capacity-factor", "--aux-loss-coef"})
    if (given(flag) && c.model.experts == 0)
      throw UsageError{std::string(flag) + " sets the mixture of experts: it needs --moe-experts E"};
  if (given("--momentum") && c.optimizer != "sgd")
    throw UsageError{"--momentum is SGD's; this run's --optimizer is " + c.optimizer};
  if (given("--vocab") && !c.data_path.empty())
    throw UsageError{"--vocab is 256 (one id per byte) with --data: drop --vocab"};
}

void check_checkpoint_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    throw UsageError{flag + " expects a checkpoint file (from --save), got '" + path + "' (" +
                     (fs::exists(path, error) ? "not a regular file" : "no such file") + ")"};
}

void check_data_file(const std::string& path, std::int64_t seq) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status))
    throw UsageError{"--data expects a readable text file, got '" + path + "' (no such file)"};
  if (fs::is_directory(status))
    throw UsageError{"--data expects a text file, got the directory '" + path + "'"};
  if (!fs::is_regular_file(status))
    throw UsageError{"--data expects a regular text file, got '" + path + "'"};
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr)
    throw UsageError{"--data: cannot read '" + path + "': " + std::strerror(errno)};
  std::fclose(file);
  const auto bytes = static_cast<std::int64_t>(fs::file_size(path, error));
  if (bytes <= seq)
    throw UsageError{"--data '" + path + "' has " + std::to_string(bytes) + " bytes, but --seq " +
                     std::to_string(seq) + " needs at least " + std::to_string(seq + 1) +
                     " (a sequence and its last target)"};
}

}  // namespace

std::string find_flag(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == flag && i + 1 < argc) return argv[i + 1];
    if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
  }
  return "";
}

namespace {

// --lora-rank makes the strategy "lora"; --lora-alpha defaults to 2 x rank.
void resolve_lora(Options& o) {
  if (!o.lora_flags) return;
  if (!o.lora_rank_given) throw UsageError{"--lora-alpha, --lora-targets and --save-merged need --lora-rank R"};
  if (o.config.strategy != "single" && o.config.strategy != "lora")
    throw UsageError{"--lora-rank trains adapters on one device or data parallel with --world N; --strategy " +
                     o.config.strategy + " trains the whole model"};
  if (!o.lora_alpha_given) o.lora.lora.alpha = 2.0 * o.lora.lora.rank;
  o.lora.lora.seed = o.config.seed;
  o.config.strategy = "lora";
}

// --precision bf16|fp16 makes the model 16-bit and the strategy "mixed".
void resolve_precision(Options& o) {
  if (o.precision == "fp32") {
    if (o.mp_flags) throw UsageError{"--loss-scale and --reduce-dtype need --precision bf16 or fp16"};
    return;
  }
  if (o.config.strategy != "single" && o.config.strategy != "mixed")
    throw UsageError{"--precision " + o.precision + " runs chapter 07's mixed-precision trainer (one device, or "
                     "data parallel with --world N); --strategy " + o.config.strategy + " trains in f32"};
  if (o.dtype_given) throw UsageError{"--precision " + o.precision + " sets the model's dtype; drop --dtype"};
  o.config.model.dtype = o.precision == "bf16" ? DType::bf16 : DType::f16;
  o.config.strategy = "mixed";
}

}  // namespace

Options parse_arguments(int argc, char** argv) {
  Options o;
  TrainConfig& config = o.config;
  ch02::DdpOptions& ddp = o.ddp;
  using Setter = std::function<void(const std::string&, const std::string&)>;
  auto as_int = [](std::int64_t v) { return static_cast<int>(v); };  // callers bound v to int
  const std::map<std::string, Setter> options = {
      {"--device", [&](auto& f, auto& v) { config.model.device = parse_with(f, v, dtp::parse_device); }},
      {"--strategy",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a strategy name, got ''"};
         // Two strategies are chosen by their own flags, which carry their settings.
         if (v == "lora") throw UsageError{"--strategy lora is chosen by --lora-rank R: give that instead"};
         if (v == "mixed") throw UsageError{"--strategy mixed is chosen by --precision bf16|fp16: give that instead"};
         config.strategy = v;
       }},
      {"--impl",
       [&](auto& f, auto& v) {
         if (v != "puzzles" && v != "reference")
           throw UsageError{f + " accepts puzzles or reference, got '" + v + "'"};
         o.impl = v;
       }},
      {"--steps", [&](auto& f, auto& v) { config.steps = parse_int(f, v, 1, kMaxSteps); }},
      {"--batch", [&](auto& f, auto& v) { config.batch = parse_int(f, v, 1, kMaxBatch); }},
      {"--seq", [&](auto& f, auto& v) { config.seq = parse_int(f, v, 1, kMaxSeq); }},
      {"--data",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a file path, got ''"};
         config.data_path = v;
       }},
      {"--seed",
       [&](auto& f, auto& v) {
         config.seed = static_cast<std::uint64_t>(parse_int(f, v, 0, std::numeric_limits<std::int64_t>::max()));
       }},
      {"--trace",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a file path, got ''"};
         config.trace_path = v;
       }},
      {"--json",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a file path, got ''"};
         config.json_path = v;
       }},
      {"--log-every", [&](auto& f, auto& v) { o.log_every = parse_int(f, v, 1, kMaxSteps); }},
      {"--save",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a file path, got ''"};
         config.save_path = v;
       }},
      {"--resume",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a checkpoint file, got ''"};
         config.resume_path = v;
       }},
      {"--load",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a checkpoint file, got ''"};
         config.load_path = v;
       }},
      {"--stop-after", [&](auto& f, auto& v) { config.stop_after = parse_int(f, v, 1, kMaxSteps); }},
      {"--layers", [&](auto& f, auto& v) { config.model.layers = as_int(parse_int(f, v, 0, 256)); }},
      {"--d-model", [&](auto& f, auto& v) { config.model.d_model = as_int(parse_int(f, v, 1, kMaxWidth)); }},
      {"--heads", [&](auto& f, auto& v) { config.model.heads = as_int(parse_int(f, v, 1, kMaxWidth)); }},
      {"--vocab", [&](auto& f, auto& v) { config.model.vocab_size = as_int(parse_int(f, v, 2, 1 << 20)); }},
      {"--attention",
       [&](auto& f, auto& v) { config.model.attention = parse_with(f, v, dtp::parse_attention_kind); }},
      {"--dtype",
       [&](auto& f, auto& v) {
         if (v != "f32" && v != "f64") throw UsageError{f + " accepts f32 or f64, got '" + v + "'"};
         config.model.dtype = dtp::parse_dtype(v);
         o.dtype_given = true;
       }},
      {"--moe-experts", [&](auto& f, auto& v) { config.model.experts = as_int(parse_int(f, v, 0, 1024)); }},
      {"--top-k", [&](auto& f, auto& v) { config.model.top_k = as_int(parse_int(f, v, 1, 1024)); }},
      {"--capacity-factor",
       [&](auto& f, auto& v) {
         config.model.capacity_factor = parse_real(f, v, 0, 1024, Ends::open_low);  // 0: no expert has room
       }},
      {"--aux-loss-coef", [&](auto& f, auto& v) { config.model.aux_loss_coef = parse_real(f, v, 0, 100); }},
      {"--moe-groups", [&](auto& f, auto& v) { config.model.moe_groups = as_int(parse_int(f, v, 1, 1024)); }},
      {"--sp",
       [&](auto& f, auto& v) {
         o.sp.sp = as_int(parse_int(f, v, 1, 1024));
         o.sp_flags = true;
       }},
      {"--sp-kind",
       [&](auto& f, auto& v) {
         o.sp.kind = parse_with(f, v, ch06::parse_sequence_parallel_kind);
         o.sp_flags = true;
       }},
      {"--sp-ulysses",
       [&](auto& f, auto& v) {
         o.sp.ulysses = as_int(parse_int(f, v, 1, 1024));
         o.sp_flags = true;
       }},
      {"--optimizer",
       [&](auto& f, auto& v) {
         if (v != "adamw" && v != "sgd") throw UsageError{f + " accepts adamw or sgd, got '" + v + "'"};
         config.optimizer = v;
       }},
      {"--lr", [&](auto& f, auto& v) { config.lr = parse_real(f, v, 1e-12, 1000); }},
      {"--warmup", [&](auto& f, auto& v) { config.warmup = parse_int(f, v, 0, kMaxSteps); }},
      {"--min-lr-ratio", [&](auto& f, auto& v) { config.min_lr_ratio = parse_real(f, v, 0, 1); }},
      {"--weight-decay", [&](auto& f, auto& v) { config.weight_decay = parse_real(f, v, 0, 100); }},
      {"--momentum", [&](auto& f, auto& v) { config.momentum = parse_real(f, v, 0, 1, Ends::open_high); }},
      {"--clip", [&](auto& f, auto& v) { config.grad_clip = parse_real(f, v, 0, 1e6); }},
      {"--lora-rank",
       [&](auto& f, auto& v) {
         o.lora.lora.rank = as_int(parse_int(f, v, 1, 4096));
         o.lora_flags = o.lora_rank_given = true;
       }},
      {"--lora-alpha",
       [&](auto& f, auto& v) {
         o.lora.lora.alpha = parse_real(f, v, 0, 1e6, Ends::open_low);
         o.lora_flags = o.lora_alpha_given = true;
       }},
      {"--save-merged",
       [&](auto& f, auto& v) {
         if (v.empty()) throw UsageError{f + " expects a file path, got ''"};
         o.lora.save_merged_path = v;
         o.lora_flags = true;
       }},
      {"--lora-targets",
       [&](auto& f, auto& v) {
         try {
           o.lora.lora.targets = ch08::parse_lora_targets(v);
         } catch (const dtp::Error& e) {
           throw UsageError{f + ": " + e.what()};
         }
         o.lora_flags = true;
       }},
      {"--precision",
       [&](auto& f, auto& v) {
         if (v != "fp32" && v != "bf16" && v != "fp16")
           throw UsageError{f + " accepts fp32, bf16 or fp16, got '" + v + "'"};
         o.precision = v;
       }},
      {"--loss-scale",
       [&](auto& f, auto& v) {
         o.mp.loss_scale = parse_with(f, v, ch07::parse_loss_scale);
         o.mp_flags = true;
       }},
      {"--reduce-dtype",
       [&](auto& f, auto& v) {
         if (v != "f32" && v != "bf16" && v != "f16")
           throw UsageError{f + " accepts f32, bf16 or f16, got '" + v + "'"};
         o.mp.reduce_dtype = dtp::parse_dtype(v);
         o.mp_flags = true;
       }},
      {"--world",
       [&](auto& f, auto& v) {
         ddp.world = o.zero.world = o.ep.world = o.mp.world = o.lora.world = as_int(parse_int(f, v, 1, 1024));
         o.world_given = true;
       }},
      {"--tp",
       [&](auto& f, auto& v) {
         o.tp.tp = as_int(parse_int(f, v, 1, 1024));
         o.tp_flags = true;
       }},
      {"--dp",
       [&](auto& f, auto& v) {
         o.tp.dp = o.pp.pipeline.dp = as_int(parse_int(f, v, 1, 1024));
         o.dp_given = true;
       }},
      {"--pp",
       [&](auto& f, auto& v) {
         o.pp.pipeline.pp = as_int(parse_int(f, v, 1, 1024));
         o.pp_flags = true;
       }},
      {"--microbatches",
       [&](auto& f, auto& v) {
         o.pp.pipeline.microbatches = as_int(parse_int(f, v, 1, 4096));
         o.pp_flags = true;
       }},
      {"--chunks",
       [&](auto& f, auto& v) {
         o.pp.pipeline.chunks = as_int(parse_int(f, v, 2, 64));
         o.pp_flags = true;
       }},
      {"--schedule",
       [&](auto& f, auto& v) {
         o.pp.pipeline.schedule = parse_with(f, v, ch05::parse_schedule_kind);
         o.pp_flags = true;
       }},
      {"--balance",
       [&](auto& f, auto& v) {
         if (v != "params" && v != "time") throw UsageError{f + " accepts params or time, got '" + v + "'"};
         o.pp.pipeline.balance_by_time = v == "time";
         o.pp_flags = true;
       }},
      {"--stage",
       [&](auto& f, auto& v) {
         o.zero.stage = as_int(parse_int(f, v, 1, 3));
         o.zero_flags = true;
       }},
      {"--bucket-mb",
       [&](auto& f, auto& v) {
         // Bounded, so the product is far inside an int64 and llround is defined.
         ddp.bucket_bytes = std::llround(parse_real(f, v, 0, 1 << 20) * 1024 * 1024);
         o.ddp_flags = true;
       }},
      {"--accumulate",
       [&](auto& f, auto& v) {
         ddp.accumulate = parse_int(f, v, 1, kMaxBatch);
         o.ddp_flags = true;
       }},
      {"--ddp-mode",
       [&](auto& f, auto& v) {
         if (v == "naive") ddp.mode = ch02::DdpMode::naive;
         else if (v == "flat") ddp.mode = ch02::DdpMode::flat;
         else if (v == "bucketed") ddp.mode = ch02::DdpMode::bucketed;
         else throw UsageError{f + " accepts naive, flat or bucketed, got '" + v + "'"};
         o.ddp_flags = true;
       }},
  };
  // Flags that take no value: present means on.
  const std::map<std::string, std::function<void()>> switches = {
      {"--prefetch", [&] { o.zero.prefetch = o.zero_flags = true; }},
      {"--offload", [&] { o.zero.offload = o.zero_flags = true; }},
      {"--sequence-parallel", [&] { o.tp.sequence_parallel = o.tp_flags = true; }},
      {"--fsdp", [&] { o.pp.pipeline.fsdp = o.pp_flags = true; }},
  };
  // CLI11 reads the command line (--flag value, --flag=value, -h); the
  // setters above check each value and say what the flag accepts.
  CLI::App app{"Trains a small GPT", "dtp-train"};
  app.formatter_fn([](const CLI::App*, std::string, CLI::AppFormatMode) { return std::string(kUsage); });
  app.allow_extras();  // reported below in DTP's words
  for (const auto& [flag, set] : options)
    app.add_option_function<std::string>(flag, [flag = flag, &set = set, &o](const std::string& value) {
      o.given.insert(flag);
      set(flag, value);
    });
  for (const auto& [flag, on] : switches) {
    app.add_flag_callback(flag, on);
    // CLI11 would read "--prefetch=yes" as a switch turned on by a value.
    for (int i = 1; i < argc; ++i)
      if (std::string arg = argv[i]; arg.rfind(flag + "=", 0) == 0)
        throw UsageError{flag + " takes no value, got '" + arg + "'"};
  }
  // CLI11 reads "--steps=" as a missing value; the setter says what fits.
  for (int i = 1; i < argc; ++i)
    if (std::string arg = argv[i]; arg.size() > 3 && arg.back() == '=')
      if (auto it = options.find(arg.substr(0, arg.size() - 1)); it != options.end()) it->second(it->first, "");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(kUsage, stdout);
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw UsageError{cli::error_text(e) + " (see --help)"};
  }
  if (!app.remaining().empty()) throw UsageError{"unknown option '" + app.remaining().front() + "' (see --help)"};
  resolve_precision(o);
  resolve_lora(o);
  return o;
}

void check_options(const Options& o) {
  const TrainConfig& config = o.config;
  std::string names;
  bool known = false;
  for (const std::string& name : strategy_names()) {
    known = known || name == config.strategy;
    if (name != "lora" && name != "mixed") names += (names.empty() ? "" : ", ") + name;  // set by their flags
  }
  if (!known)
    throw UsageError{"--strategy: unknown strategy '" + config.strategy + "'; accepted: " + names};
  if (o.world_given && config.strategy != "ddp" && config.strategy != "zero" && config.strategy != "ep" &&
      config.strategy != "mixed" && config.strategy != "lora")
    throw UsageError{"--world needs a data-parallel strategy: --strategy ddp, zero or ep, --precision bf16|fp16, "
                     "or --lora-rank"};
  if (o.sp_flags && config.strategy != "sp")
    throw UsageError{"--sp, --sp-kind and --sp-ulysses need --strategy sp"};
  if (o.ddp_flags && config.strategy != "ddp")
    throw UsageError{"--bucket-mb, --accumulate and --ddp-mode need --strategy ddp"};
  if (o.zero_flags && config.strategy != "zero")
    throw UsageError{"--stage, --prefetch and --offload need --strategy zero"};
  if (o.tp_flags && config.strategy != "tp")
    throw UsageError{"--tp and --sequence-parallel need --strategy tp"};
  if (o.pp_flags && config.strategy != "pp")
    throw UsageError{"--pp, --microbatches, --schedule, --chunks, --fsdp and --balance need --strategy pp"};
  if (o.dp_given && config.strategy != "tp" && config.strategy != "pp")
    throw UsageError{"--dp needs --strategy tp or --strategy pp"};
  if (config.model.d_model % config.model.heads != 0)
    throw UsageError{"--heads " + std::to_string(config.model.heads) + " must divide --d-model " +
                     std::to_string(config.model.d_model)};
  check_no_ignored_flags(o);
  if (config.model.top_k > std::max(config.model.experts, 1))
    throw UsageError{"--top-k " + std::to_string(config.model.top_k) + " needs at least as many experts (--moe-experts " +
                     std::to_string(config.model.experts) + ")"};
  if (config.strategy == "ddp") {
    try {
      ch02::validate_ddp(config, o.ddp);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "zero") {
    try {
      ch03::validate_zero(config, o.zero);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "tp") {
    try {
      ch04::validate_tensor_parallel(config, o.tp);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "pp") {
    try {
      ch05::validate_pipeline(config, o.pp.pipeline);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "sp") {
    try {
      ch06::validate_sequence_parallel(config, o.sp);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "ep") {
    try {
      ch06::validate_expert_parallel(config, o.ep);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (config.strategy == "mixed") {
    try {
      ch07::validate_mixed_precision(config, o.mp);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (!config.data_path.empty()) check_data_file(config.data_path, config.seq);
  if (!config.trace_path.empty() && config.trace_path == config.json_path)
    throw UsageError{"--trace and --json name the same file '" + config.json_path + "'"};
  if (config.strategy == "lora") {
    try {
      ch08::validate_lora(config, o.lora);
    } catch (const dtp::Error& e) {
      throw UsageError{e.what()};
    }
  }
  if (!config.resume_path.empty() && !config.load_path.empty() && config.strategy != "lora")
    throw UsageError{"--resume continues a run and --load starts a new one from saved parameters: give one, not both "
                     "(under --lora-rank they go together: --load the base, --resume the adapters)"};
  if (config.stop_after > config.steps)
    throw UsageError{"--stop-after " + std::to_string(config.stop_after) + " is past --steps " +
                     std::to_string(config.steps)};
  if (!config.save_path.empty()) check_save_path("--save", config.save_path);
  if (!o.lora.save_merged_path.empty()) {
    check_save_path("--save-merged", o.lora.save_merged_path);
    if (o.lora.save_merged_path == config.save_path)
      throw UsageError{"--save and --save-merged name the same file '" + config.save_path + "'"};
  }
  if (!config.resume_path.empty()) check_checkpoint_file("--resume", config.resume_path);
  if (!config.load_path.empty()) check_checkpoint_file("--load", config.load_path);
  if (config.model.device.is_cuda() && dtp::cuda_device_count() == 0)
    throw UsageError{"--device " + config.model.device.str() +
                     ": no usable CUDA device here (none found, or DTP was built without CUDA)"};
  check_files_apart(o);
  // The environment the runtime reads, before the run prints its header.
  try {
    (void)World::from_env(1);
    (void)default_timeout_seconds();
  } catch (const dtp::Error& e) {
    throw UsageError{std::string("the environment: ") + e.what()};
  }
  // Last: these create the files, which a later usage error would leave behind.
  if (!config.trace_path.empty()) check_writable("--trace", config.trace_path);
  if (!config.json_path.empty()) check_writable("--json", config.json_path);
}

}  // namespace dtp::train_app
