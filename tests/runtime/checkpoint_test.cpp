// Checkpoints: the JSON header parser, the file format (round trip, atomic
// replacement, every kind of damage a clear error), and training runs that
// save, resume and load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/json.h"
#include "dtp/train_checkpoint.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "support/harness.h"

namespace dtp {
namespace {

namespace fs = std::filesystem;

void expect_error_containing(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "expected a dtp::Error containing \"" << part << "\", but nothing was thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "expected \"" << part << "\" in the error:\n"
        << e.what();
  }
}

using testing::TempFolder;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// --- the JSON parser ------------------------------------------------------------------

TEST(Json, ParsesWhatTheWritersWrite) {
  JsonLine line;
  line.add("name", "a \"quoted\"\\path\n")
      .add("count", std::int64_t{9007199254740993})
      .add("x", 0.1)
      .add("ok", true)
      .add("dims", std::vector<std::int64_t>{2, 3})
      .raw("none", "null");
  const JsonValue value = parse_json(line.str());
  EXPECT_EQ(value.at("name").as_string("name"), "a \"quoted\"\\path\n");
  EXPECT_EQ(value.at("count").as_int("count"), 9007199254740993)
      << "integers past 2^53 read back exactly";
  EXPECT_EQ(value.at("x").as_number("x"), 0.1);
  EXPECT_TRUE(value.at("ok").boolean);
  ASSERT_EQ(value.at("dims").items.size(), 2u);
  EXPECT_EQ(value.at("dims").items[1].as_int("dims"), 3);
  EXPECT_EQ(value.at("none").kind, JsonValue::Kind::null);
  EXPECT_EQ(parse_json(value.dump()).dump(), value.dump())
      << "dump() writes what parse_json() reads";
  EXPECT_EQ(parse_json(R"("\u00e9\ud83d\ude00")").text, "\xc3\xa9\xf0\x9f\x98\x80")
      << "\\u escapes become UTF-8";
}

TEST(Json, ErrorsNameTheByteAndWhatWasExpected) {
  expect_error_containing([] { parse_json(R"({"a": 1,})"); },
                          "expected a member name in quotes at byte 8");
  expect_error_containing([] { parse_json(R"({"a" 1})"); },
                          "expected ':' after a member name at byte 5");
  expect_error_containing([] { parse_json("[1, 2"); },
                          "expected ',' or ']' at byte 5, found the end");
  expect_error_containing([] { parse_json("01"); }, "expected the end of the text at byte 1");
  expect_error_containing([] { parse_json("\"abc"); }, "a closing '\"'");
  expect_error_containing([] { parse_json("tru"); }, "expected a value at byte 0");
  expect_error_containing([] { parse_json(std::string(100, '[') + std::string(100, ']')); },
                          "less nesting");
  expect_error_containing([] { parse_json("{}").at("missing"); }, "no member 'missing'");
  expect_error_containing([] { parse_json("1.5").as_int("step"); },
                          "step: expected an integer that fits 64 bits, got 1.5");
}

// --- the file ---------------------------------------------------------------------------

Checkpoint sample_checkpoint() {
  Checkpoint checkpoint;
  checkpoint.kind = "training";
  checkpoint.step = 12;
  checkpoint.config = parse_json(R"({"batch":16,"model":{"d_model":64}})");
  checkpoint.tensors = {
      {"params/a", Tensor::from_values({1.5, -2.25, 3e-8, 1e30}, DType::f32).view({2, 2})},
      {"params/b", Tensor::from_values({std::acos(-1.0), -0.0}, DType::f64)},
      {"params/c", Tensor::from_values({1.0, 0.5, -3}, DType::bf16)},
      {"ids", Tensor::from_values({7, -1, 2147483647}, DType::i32)},
      {"empty", Tensor::zeros({0}, DType::f32)},
  };
  return checkpoint;
}

TEST(CheckpointFile, RoundTripKeepsEveryBitNameShapeAndDtype) {
  TempFolder folder;
  const Checkpoint saved = sample_checkpoint();
  write_checkpoint(folder.file("x.ckpt"), saved);
  EXPECT_FALSE(fs::exists(folder.file("x.ckpt.tmp")))
      << "the temporary file is renamed, not left behind";
  const Checkpoint loaded = read_checkpoint(folder.file("x.ckpt"));
  EXPECT_EQ(loaded.kind, "training");
  EXPECT_EQ(loaded.step, 12);
  EXPECT_EQ(loaded.config.at("model").at("d_model").as_int("d_model"), 64);
  ASSERT_EQ(loaded.tensors.size(), saved.tensors.size());
  for (std::size_t i = 0; i < saved.tensors.size(); ++i) {
    const Tensor& a = saved.tensors[i].tensor;
    const Tensor& b = loaded.tensors[i].tensor;
    EXPECT_EQ(loaded.tensors[i].name, saved.tensors[i].name);
    EXPECT_EQ(b.shape(), a.shape()) << saved.tensors[i].name;
    EXPECT_EQ(b.dtype(), a.dtype()) << saved.tensors[i].name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0)
        << saved.tensors[i].name << ": the bytes differ";
  }
  expect_error_containing([&] { loaded.tensor("params/zz"); },
                          "no tensor 'params/zz' (it has params/a, params/b");
}

TEST(CheckpointFile, AFailedSaveLeavesTheOldFileAsItWas) {
  TempFolder folder;
  const std::string path = folder.file("x.ckpt");
  write_checkpoint(path, sample_checkpoint());
  const std::string before = read_bytes(path);
  fs::create_directory(path + ".tmp");  // the temporary file cannot be created
  Checkpoint other = sample_checkpoint();
  other.step = 99;
  expect_error_containing([&] { write_checkpoint(path, other); }, "cannot create " + path + ".tmp");
  EXPECT_EQ(read_bytes(path), before) << "the old checkpoint must survive a failed save";
}

TEST(CheckpointFile, EveryKindOfDamageIsAClearError) {
  TempFolder folder;
  const std::string good = folder.file("good.ckpt"), bad = folder.file("bad.ckpt");
  write_checkpoint(good, sample_checkpoint());
  const std::string bytes = read_bytes(good);
  const std::size_t header_start = bytes.find('\n') + 1;
  const std::size_t data_start = bytes.find('\n', header_start) + 1;
  auto damaged = [&](const std::string& content, const std::string& message) {
    write_bytes(bad, content);
    expect_error_containing([&] { read_checkpoint(bad); }, message);
  };
  damaged("hello\n", "not a DTP checkpoint");
  damaged("", "not a DTP checkpoint");
  damaged("DTPCKPT 2 10\n{}\n", "format version 2; this build reads version 1");
  damaged(bytes.substr(0, header_start + 10), "truncated");
  damaged(bytes.substr(0, data_start + 3), "truncated");
  damaged(bytes.substr(0, bytes.size() - 1), "truncated");
  damaged(bytes + "x", "extra bytes at the end");
  std::string flipped = bytes;
  flipped[data_start + 5] ^= 0x10;
  damaged(flipped, "the file is corrupt");
  std::string broken_header = bytes;
  broken_header[header_start] = '[';
  damaged(broken_header, "the header is not valid JSON");
  // The file with the first @p from of its header written as @p to.
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string copy = bytes;
    copy.replace(copy.find(from), from.size(), to);
    return copy;
  };
  damaged(edited("\"bytes\":16", "\"bytes\":17"),
          "tensor 'params/a' is 17 bytes, but [2, 2] of f32 needs 16");
  // The checksum covers the data; a damaged header is caught by its own checks.
  damaged(edited("\"offset\":16", "\"offset\":12"),
          "tensor 'params/b' starts at data byte 12, but the tensor before it ends at byte 16");
  damaged(edited("\"bytes\"", "\"bytXs\""),
          "the header's list of tensors is damaged (a corrupt file)");
  damaged(edited("\"dtype\":\"f64\"", "\"dtype\":\"f65\""),
          "the header's list of tensors is damaged");
  // Fields that parse but cannot be: a negative step would resume with
  // negative learning rates; an unknown kind; two tensors of one name.
  // (Each edit keeps the header's length, which its first line states.)
  damaged(edited("\"step\":12", "\"step\":-5"),
          "the header says step -5; a step count is 0 or more");
  damaged(edited("\"kind\":\"training\"", "\"kind\":\"kindless\""),
          "the header's kind is 'kindless'");
  damaged(edited("\"name\":\"params/b\"", "\"name\":\"params/a\""),
          "two tensors are called 'params/a'");
  // A header length that overflows when added to the first line's length.
  damaged("DTPCKPT 1 9223372036854775807\n{}\n",
          "too short for its 9223372036854775807-byte header");
  expect_error_containing([&] { read_checkpoint(folder.file("missing.ckpt")); }, "no such file");
  expect_error_containing([&] { read_checkpoint("/dev/null"); }, "/dev/null is not a regular file");
  expect_error_containing([&] { read_checkpoint(folder.path.string()); }, "is not a regular file");
}

// --- training runs ----------------------------------------------------------------------

TrainConfig tiny_run(const std::string& optimizer) {
  TrainConfig config;
  config.model.d_model = 32;
  config.model.heads = 2;
  config.model.layers = 1;
  config.steps = 8;
  config.batch = 4;
  config.seq = 16;
  config.lr = 1e-2;
  config.warmup = 2;
  config.optimizer = optimizer;
  config.synthetic.length = 1 << 14;
  return config;
}

void expect_same_parameters(GPT& a, GPT& b, const std::string& what) {
  const auto ua = a.units(), ub = b.units();
  for (std::size_t u = 0; u < ua.size(); ++u)
    ASSERT_EQ(std::memcmp(ua[u]->params().raw(), ub[u]->params().raw(), ua[u]->params().nbytes()),
              0)
        << what << ": unit " << ua[u]->name() << "'s parameters differ";
}

TEST(CheckpointTraining, ResumingEqualsTheRunThatWasNeverStoppedBitForBit) {
  TempFolder folder;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    const TrainConfig config = tiny_run(optimizer);
    Trainer whole(config), first(config);
    std::vector<double> losses;
    for (int s = 0; s < 8; ++s) losses.push_back(whole.step().loss);
    for (int s = 0; s < 4; ++s) first.step();
    first.save(folder.file(optimizer + ".ckpt"));
    Trainer second(config);
    second.resume(folder.file(optimizer + ".ckpt"));
    EXPECT_EQ(second.steps_done(), 4);
    EXPECT_EQ(second.optimizer().steps(), 4)
        << optimizer << ": the bias correction continues from step 4";
    for (int s = 4; s < 8; ++s)
      EXPECT_EQ(second.step().loss, losses[s])
          << optimizer << ": step " << s + 1 << "'s loss after resuming";
    expect_same_parameters(whole.model(), second.model(), optimizer + " after 4 + 4 steps");
    const auto state_a = whole.optimizer().state(), state_b = second.optimizer().state();
    ASSERT_EQ(state_a.size(), state_b.size());
    for (std::size_t i = 0; i < state_a.size(); ++i)
      EXPECT_EQ(
          std::memcmp(state_a[i].tensor.raw(), state_b[i].tensor.raw(), state_a[i].tensor.nbytes()),
          0)
          << optimizer << ": optimizer state " << state_a[i].name << " differs";
  }
}

TEST(CheckpointTraining, TheCommandLinePathTrainsInSlices) {
  TempFolder folder;
  TrainConfig whole = tiny_run("adamw");
  TrainResult straight = train(whole);
  TrainConfig first = whole;
  first.stop_after = 3;
  first.save_path = folder.file("slice.ckpt");
  TrainResult a = train(first);
  TrainConfig second = whole;
  second.resume_path = first.save_path;
  TrainResult b = train(second);
  ASSERT_EQ(a.steps.size() + b.steps.size(), straight.steps.size());
  for (std::size_t s = 0; s < straight.steps.size(); ++s) {
    const StepRecord& r = s < a.steps.size() ? a.steps[s] : b.steps[s - a.steps.size()];
    EXPECT_EQ(r.step, straight.steps[s].step);
    EXPECT_EQ(r.loss, straight.steps[s].loss) << "step " << s + 1;
  }
}

TEST(CheckpointTraining, ResumingWithOtherSettingsNamesEachOne) {
  TempFolder folder;
  const TrainConfig config = tiny_run("adamw");
  Trainer trainer(config);
  trainer.step();
  trainer.save(folder.file("run.ckpt"));
  TrainConfig changed = config;
  changed.batch = 8;
  changed.model.d_model = 64;
  changed.steps = 20;  // free to change
  Trainer other(changed);
  try {
    other.resume(folder.file("run.ckpt"));
    ADD_FAILURE() << "resuming with another batch and width must fail";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("batch 4 in the saved run, 8 in this one"), std::string::npos) << text;
    EXPECT_NE(text.find("model.d_model 32 in the saved run, 64 in this one"), std::string::npos)
        << text;
    EXPECT_EQ(text.find("\n  steps"), std::string::npos) << "steps may change: " << text;
  }
  TrainConfig short_run = config;
  short_run.steps = 1;
  Trainer done(short_run);
  expect_error_containing([&] { done.resume(folder.file("run.ckpt")); },
                          "at step 1, so --steps 1 leaves nothing");
}

TEST(CheckpointTraining, LoadingParametersStartsANewRunFromThem) {
  TempFolder folder;
  const TrainConfig config = tiny_run("adamw");
  Trainer pretrained(config);
  for (int s = 0; s < 3; ++s) pretrained.step();
  pretrained.save(folder.file("base.ckpt"));
  TrainConfig finetune = config;
  finetune.seed = 99;  // other data; the weights come from the file
  Trainer tuned(finetune);
  load_parameters(tuned.model(), read_checkpoint(folder.file("base.ckpt")),
                  folder.file("base.ckpt"));
  expect_same_parameters(pretrained.model(), tuned.model(), "after --load");
  EXPECT_EQ(tuned.steps_done(), 0);
  TrainConfig wider = config;
  wider.model.d_model = 64;
  Trainer mismatched(wider);
  expect_error_containing(
      [&] {
        load_parameters(mismatched.model(), read_checkpoint(folder.file("base.ckpt")), "base.ckpt");
      },
      "this model's params/embedding.tokens is [64, 64] f32 but the checkpoint holds [64, 32] f32; "
      "the model "
      "settings differ:\n  model.d_model 32 in the saved run, 64 in this one");
}

// PyTorch's load_state_dict casts a tensor of another float dtype into the
// parameter; --load does too. f32 widens to f64 exactly; to bf16 it rounds to
// the nearest bf16 (within half a unit in the last of bf16's 8 bits).
TEST(CheckpointTraining, LoadingCastsParametersOfAnotherFloatDtype) {
  TempFolder folder;
  const TrainConfig config = tiny_run("adamw");
  Trainer pretrained(config);
  pretrained.step();
  pretrained.save(folder.file("f32.ckpt"));
  const Checkpoint f32 = read_checkpoint(folder.file("f32.ckpt"));
  for (const DType dtype : {DType::f64, DType::bf16}) {
    TrainConfig other = config;
    other.model.dtype = dtype;
    Trainer tuned(other);
    load_parameters(tuned.model(), f32, "f32.ckpt");
    for (Unit* unit : tuned.model().units()) {
      for (const ParamView& p : unit->parameters()) {
        const std::vector<double> want =
            f32.tensor("params/" + unit->name() + "." + p.name).to_vector();
        const std::vector<double> got = p.value.to_vector();
        ASSERT_EQ(got.size(), want.size()) << p.name;
        for (std::size_t i = 0; i < want.size(); ++i) {
          const double bound = dtype == DType::f64 ? 0.0 : std::ldexp(std::fabs(want[i]), -8);
          ASSERT_LE(std::fabs(got[i] - want[i]), bound)
              << dtype_name(dtype) << " model, " << unit->name() << "." << p.name << " element "
              << i << ": the f32 file holds " << want[i] << ", the loaded parameter is " << got[i];
        }
      }
    }
  }
}

// Every strategy DTP registers checkpoints; one registered later (a
// student's own) must say that it does not, not ignore --save.
}  // namespace
}  // namespace dtp
