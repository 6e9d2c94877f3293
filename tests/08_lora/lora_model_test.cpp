// Puzzle 8.3: adapters on a GPT. The adapted model starts as the base model,
// only the adapters train, the base's gradient and optimizer memory are gone,
// the adapters' gradients follow the full-rank chain rule, three steps of
// training follow the checker's own, and every bad setting is an error
// naming it. The model is f64 on the CPU, f32 on a GPU (lora_checks.h).
#include <functional>

#include "lora_checks.h"

namespace dtp {
namespace {

using namespace testing::ch08;

Batch a_batch(const GPTConfig& config, std::uint64_t seed) {
  Rng rng(seed);
  Batch b{Tensor::empty({3, config.context}, DType::i32),
          Tensor::empty({3, config.context}, DType::i32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
    b.targets.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
  }
  return {b.inputs.to(config.device), b.targets.to(config.device)};
}

GPTConfig model_config() { return lora_tiny_config().resolved_model(); }

ch08::LoraConfig lora_config(std::vector<std::string> targets = {"attn.q", "attn.v"}) {
  ch08::LoraConfig c;
  c.rank = 2;
  c.alpha = 4;
  c.targets = std::move(targets);
  c.seed = 5;
  return c;
}

/// Gives every B nonzero values (a trained adapter), deterministically.
void set_every_b(ch08::LoraModel& lora, int blocks) {
  for (int i = 0; i < blocks; ++i)
    for (const std::string& name : lora.config().targets) {
      Tensor b = lora.adapter(i, name).b;
      b.copy_from(seeded(b.shape(), 100 + i * 7 + name.size(), 0.3));
    }
}

TEST(Puzzle8_3_lora_model, WithBZeroTheAdaptedGptIsTheBaseGptBitForBit) {
  const GPTConfig config = model_config();
  GPT base(config), adapted(config);
  const Batch batch = a_batch(config, 1);
  const double expected = base.forward(batch.inputs, batch.targets);
  ch08::LoraModel lora(adapted, lora_config(ch08::all_lora_targets()));
  const double got = adapted.forward(batch.inputs, batch.targets);
  EXPECT_EQ(got, expected)
      << "B starts at 0, so every adapter adds exactly 0: the loss must be the base model's, "
         "bit for bit (got "
      << got << ", base " << expected << ")";
  for (Unit* unit : adapted.units())
    EXPECT_TRUE(unit->frozen()) << unit->name()
                                << " is not frozen: LoraModel must freeze every unit of the base";
}

TEST(Puzzle8_3_lora_model, LayoutCountsAndInitialization) {
  const GPTConfig config = model_config();
  GPT model(config);
  const auto targets = std::vector<std::string>{"attn.q", "mlp.fc"};
  ch08::LoraModel lora(model, lora_config(targets));
  const std::int64_t c = config.d_model, hidden = config.mlp_ratio * c, r = 2;
  const std::int64_t per_block = r * (c + c) + r * (c + hidden);
  ASSERT_EQ(ch08::lora_parameter_count(config, lora_config(targets)), config.layers * per_block)
      << "the provided count from the shapes (drivers/08_lora) disagrees with the checker's "
         "formula";
  EXPECT_EQ(lora.trainable_parameters(), config.layers * per_block)
      << "blocks x sum over targets of r (in + out): " << config.layers << " x (2 (" << c << " + "
      << c << ") + 2 (" << c << " + " << hidden << "))";
  const auto buffers = lora.buffers();
  ASSERT_EQ(buffers.size(), static_cast<std::size_t>(config.layers)) << "one ParamBuffer per block";
  for (int i = 0; i < config.layers; ++i) {
    const ParamBuffer& buffer = buffers[static_cast<std::size_t>(i)];
    EXPECT_EQ(buffer.name, "block." + std::to_string(i) + ".lora");
    ASSERT_EQ(buffer.params.numel(), per_block) << buffer.name;
    ASSERT_TRUE(buffer.grads.defined() && buffer.grads.numel() == per_block)
        << buffer.name << " needs a gradient buffer";
    // Layout A then B per target; A drawn by the checker the same way.
    Rng rng(Rng::derive(5, static_cast<std::uint64_t>(i)));
    std::int64_t offset = 0;
    for (const std::string& name : targets) {
      const ch08::LoraLinear& adapter = lora.adapter(i, name);
      const std::int64_t in = name == "attn.q" ? c : c, out = name == "attn.q" ? c : hidden;
      EXPECT_EQ(adapter.a.shape(), Shape({r, in})) << name << "'s A";
      EXPECT_EQ(adapter.b.shape(), Shape({out, r})) << name << "'s B";
      EXPECT_EQ(adapter.scale, 2.0) << "alpha / r = 4 / 2";
      Tensor expected_a = Tensor::empty(
          {r, in}, dtype());  // drawn on the host in the model's dtype, as the model does
      ops::fill_normal(expected_a, 0.0, 1.0 / std::sqrt(static_cast<double>(in)), rng);
      EXPECT_EQ(
          compare(
              name + "'s A (normal(0, 1/sqrt(in)) from Rng::derive(seed, block), targets in order)",
              matrix(expected_a), matrix(adapter.a), 0.0),
          "");
      EXPECT_EQ(adapter.a.raw(),
                static_cast<const void*>(static_cast<const char*>(buffer.params.raw()) +
                                         offset * adapter.a.element_size()))
          << name << "'s A must be a view of the block's buffer at element " << offset;
      offset += r * in;
      for (double v : adapter.b.to_vector()) ASSERT_EQ(v, 0.0) << name << "'s B must start at zero";
      offset += out * r;
    }
  }
  EXPECT_EQ(&model.block(0).attn.q.adapter == nullptr ? nullptr : model.block(0).attn.q.adapter,
            static_cast<const LinearAdapter*>(&lora.adapter(0, "attn.q")))
      << "the adapter must be attached to its Linear (Linear::adapter)";
  EXPECT_EQ(model.block(0).attn.v.adapter, nullptr) << "attn.v is not a target here";
}

TEST(Puzzle8_3_lora_model, AdapterGradientsFollowTheFullRankChainRule) {
  // A copy of the model with W + s B A merged by the checker, trained in full:
  // its weight gradient G gives dA = s B^T G and dB = s G A^T.
  const GPTConfig config = model_config();
  GPT adapted(config), full(config);
  ch08::LoraModel lora(adapted, lora_config());
  set_every_b(lora, config.layers);
  for (int i = 0; i < config.layers; ++i)
    for (const std::string& name : lora.config().targets) {
      const ch08::LoraLinear& adapter = lora.adapter(i, name);
      Linear& linear = ch08::target_linear(full.block(i), name);
      linear.weight.copy_from(on_device(
          effective_weight(linear.weight, adapter.a, adapter.b, 2.0).v, linear.weight.shape()));
    }
  const Batch batch = a_batch(config, 2);
  full.zero_grad();
  full.forward(batch.inputs, batch.targets);
  full.backward();
  lora.zero_grad();
  adapted.forward(batch.inputs, batch.targets);
  adapted.backward();
  for (int i = 0; i < config.layers; ++i)
    for (const std::string& name : lora.config().targets) {
      const ch08::LoraLinear& adapter = lora.adapter(i, name);
      const Matrix g = matrix(ch08::target_linear(full.block(i), name).weight_grad);
      Matrix da = product(matrix(adapter.b), true, g, false),
             db = product(g, false, matrix(adapter.a), true);
      for (double& v : da.v) v *= 2.0;
      for (double& v : db.v) v *= 2.0;
      const std::string where = "block " + std::to_string(i) + " " + name;
      EXPECT_EQ(compare(where + " dA", da, matrix(adapter.grad_a), tolerance(1e-10, 2e-2)), "");
      EXPECT_EQ(compare(where + " dB", db, matrix(adapter.grad_b), tolerance(1e-10, 2e-2)), "");
    }
}

TEST(Puzzle8_3_lora_model, OnlyAdaptersTrainAndTheirStateIsAllTheMemory) {
  const TrainConfig config = lora_tiny_config(6, 3);
  Trainer trainer(config);
  const std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  const std::int64_t grads_before = tracker->live(MemoryCategory::grads);
  const std::int64_t optimizer_before = tracker->live(MemoryCategory::optimizer);
  GPT& model = trainer.model();
  std::vector<Tensor> base;
  for (Unit* unit : model.units()) base.push_back(unit->params().clone());
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(config.model.dtype));
  const std::int64_t base_grad_bytes = model.parameter_count() * element;

  ch08::LoraModel lora(model, lora_config());
  TrainConfig adamw = config;
  adamw.optimizer = "adamw";
  trainer.set_optimizer(make_optimizer(adamw, lora.buffers()));
  trainer.on_zero_grad([&] { lora.zero_grad(); });
  const std::int64_t adapter_bytes = lora.trainable_parameters() * element;
  EXPECT_EQ(tracker->live(MemoryCategory::grads) - grads_before, adapter_bytes - base_grad_bytes)
      << "gradient memory: the base's " << base_grad_bytes
      << " bytes must be released (frozen) and only the " << lora.trainable_parameters()
      << " adapter parameters x " << element << " bytes added";
  EXPECT_EQ(tracker->live(MemoryCategory::optimizer) - optimizer_before, 2 * adapter_bytes)
      << "AdamW over the adapters only: m and v, 2 x " << adapter_bytes << " bytes";

  for (int s = 0; s < 3; ++s) trainer.step();
  const auto units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u)
    ASSERT_EQ(bitwise(units[u]->name() + "'s weights", base[u], units[u]->params()), "")
        << "they changed in training: the base must stay frozen, bit for bit";
  double moved = 0;
  for (double v : lora.adapter(0, "attn.q").b.to_vector()) moved += std::fabs(v);
  EXPECT_GT(moved, 0)
      << "after 3 steps block 0's attn.q B is still all zero: the adapters did not train";
}

// Three steps of training against the checker's own LoRA training
// (lora_checks.h: a full-rank model, the chain rule in loops): the gradients
// right after each backward, the loss and the adapters after each step. A
// gradient left over from the step before shows from step 2 on.
TEST(Puzzle8_3_lora_model, ThreeStepsOfTrainingFollowTheCheckersOwnLoraTraining) {
  constexpr int kSteps = 3;
  const TrainConfig config = lora_tiny_config(6, kSteps);
  const LoraTrajectory expected = checker_lora_training(config, lora_config(), kSteps);
  Trainer trainer(config);
  ch08::LoraModel lora(trainer.model(), lora_config());
  trainer.set_optimizer(make_optimizer(config, lora.buffers()));
  trainer.on_zero_grad([&] { lora.zero_grad(); });
  std::vector<double> gradients;
  trainer.on_after_backward([&] { gradients = adapter_gradients(lora); });
  const std::int64_t start = first_apart(expected.start, adapter_parameters(lora));
  ASSERT_LT(start, 0) << "before training, " << expected.where(start)
                      << " differs from the checker's draw (see LayoutCountsAndInitialization)";
  std::vector<double> previous;
  for (int step = 1; step <= kSteps; ++step) {
    const double loss = trainer.step().loss;
    ASSERT_EQ(check_step_gradients(expected, step, gradients, previous), "");
    previous = gradients;
    EXPECT_LE(
        std::fabs(loss - expected.losses[static_cast<std::size_t>(step - 1)]),
        trajectory_tolerance() * std::fabs(expected.losses[static_cast<std::size_t>(step - 1)]))
        << "step " << step << ": the loss is " << loss << ", the checker's is "
        << expected.losses[static_cast<std::size_t>(step - 1)];
    const std::vector<double> params = adapter_parameters(lora);
    const std::vector<double>& want = expected.params[static_cast<std::size_t>(step - 1)];
    const std::int64_t i = first_moved_apart(expected, want, params);
    ASSERT_LT(i, 0) << "after step " << step << ", " << expected.where(i) << " is "
                    << params[static_cast<std::size_t>(i)] << ", the checker's is "
                    << want[static_cast<std::size_t>(i)]
                    << " while the gradients were right: the update missed the adapters (are "
                       "buffers() the adapters' own storage, not copies?)";
  }
}

TEST(Puzzle8_3_lora_model, AMergedModelComputesWhatTheAdaptedOneDid) {
  const GPTConfig config = model_config();
  GPT model(config);
  ch08::LoraModel lora(model, lora_config(ch08::all_lora_targets()));
  set_every_b(lora, config.layers);
  const Batch batch = a_batch(config, 3);
  std::vector<Tensor> weights;
  for (int i = 0; i < config.layers; ++i)
    for (const std::string& name : ch08::all_lora_targets())
      weights.push_back(ch08::target_linear(model.block(i), name).weight.clone());
  const Tensor adapted = model.logits(batch.inputs);
  lora.merge_all();
  EXPECT_TRUE(lora.merged());
  EXPECT_EQ(model.block(0).attn.q.adapter, nullptr)
      << "merge_all detaches the adapters (they are in W now)";
  EXPECT_EQ(compare("logits of the merged model", matrix(adapted),
                    matrix(model.logits(batch.inputs)), tolerance(1e-12, 1e-2)),
            "");
  // Unmerging subtracts what merging added: W comes back up to the rounding
  // of W + s B A (s B A is larger than W here), within 1e-14 of the largest
  // in f64 (1e-5 in f32: the same product is subtracted, so TF32's rounding
  // of it cancels; what is left is f32's rounding of the sum).
  lora.unmerge_all();
  EXPECT_FALSE(lora.merged());
  std::size_t k = 0;
  for (int i = 0; i < config.layers; ++i)
    for (const std::string& name : ch08::all_lora_targets())
      EXPECT_EQ(
          compare("block " + std::to_string(i) + " " + name +
                      ".weight after merge_all then unmerge_all",
                  matrix(weights[k++]), matrix(ch08::target_linear(model.block(i), name).weight),
                  tolerance(1e-14, 1e-5)),
          "");
  EXPECT_EQ(compare("logits after unmerge_all", matrix(adapted), matrix(model.logits(batch.inputs)),
                    tolerance(1e-12, 1e-2)),
            "");
}

/// "" when @p call throws a dtp::Error whose message holds every one of
/// @p words; else what it did instead, for the message of @p what.
std::string error_naming(const std::string& what, const std::function<void()>& call,
                         const std::vector<std::string>& words) {
  try {
    call();
  } catch (const Error& e) {
    for (const std::string& word : words)
      if (std::string(e.what()).find(word) == std::string::npos)
        return what + ": the dtp::Error must name " + word + "; it says: " + e.what();
    return "";
  }
  return what + ": expected a dtp::Error naming " + words.front() + ", got none";
}

/// "" when a refused LoraModel left @p model as it was: nothing frozen, nothing attached.
std::string untouched(GPT& model, const std::string& what) {
  for (Unit* unit : model.units())
    if (unit->frozen())
      return what + ": " + unit->name() +
             " was frozen by a LoraModel that then refused its settings";
  for (int i = 0; i < model.num_blocks(); ++i)
    for (const std::string& name : ch08::all_lora_targets())
      if ((!model.block(i).is_moe() || name.rfind("attn.", 0) == 0) &&
          ch08::target_linear(model.block(i), name).adapter != nullptr)
        return what + ": block " + std::to_string(i) + "'s " + name +
               " has an adapter attached by a LoraModel that then refused its settings";
  return "";
}

// Every error the contract promises for bad settings, each naming the bad
// value, thrown before the model changes.
TEST(Puzzle8_3_lora_model, BadSettingsAreRefusedBeforeTheModelChanges) {
  GPT model(model_config());
  ch08::LoraConfig negative_rank = lora_config();
  negative_rank.rank = -3;
  EXPECT_EQ(error_naming("rank -3", [&] { ch08::LoraModel lora(model, negative_rank); }, {"-3"}),
            "");
  EXPECT_EQ(untouched(model, "rank -3"), "");
  ch08::LoraConfig zero_rank = lora_config();
  zero_rank.rank = 0;
  EXPECT_EQ(error_naming("rank 0", [&] { ch08::LoraModel lora(model, zero_rank); }, {"0"}), "");
  const ch08::LoraConfig unknown = lora_config({"attn.q", "attn.x"});
  EXPECT_EQ(
      error_naming("target attn.x", [&] { ch08::LoraModel lora(model, unknown); }, {"attn.x"}), "");
  EXPECT_EQ(untouched(model, "target attn.x"), "");

  // A mixture-of-experts block has no single MLP to adapt.
  GPTConfig moe_config = model_config();
  moe_config.experts = 2;
  GPT moe(moe_config);
  const ch08::LoraConfig mlp_on_moe = lora_config({"attn.q", "mlp.fc"});
  EXPECT_EQ(error_naming("mlp.fc on a mixture-of-experts model",
                         [&] { ch08::LoraModel lora(moe, mlp_on_moe); }, {"mlp.fc"}),
            "");
  EXPECT_EQ(untouched(moe, "mlp.fc on a mixture-of-experts model"), "");

  // The provided parsers the driver's --lora-targets goes through.
  EXPECT_EQ(error_naming("parse_lora_targets(\"attn.q,attn.x\")",
                         [] { ch08::parse_lora_targets("attn.q,attn.x"); }, {"attn.x", "mlp.proj"}),
            "");
  EXPECT_EQ(error_naming("parse_lora_targets(\"attn.q,attn.q\")",
                         [] { ch08::parse_lora_targets("attn.q,attn.q"); }, {"attn.q"}),
            "");
  EXPECT_EQ(error_naming("lora_parameter_count with target attn.x",
                         [&] { ch08::lora_parameter_count(model_config(), unknown); }, {"attn.x"}),
            "");
}

// Asking for an adapter that is not there names the ones that are.
TEST(Puzzle8_3_lora_model, AskingForAMissingAdapterNamesTheAdaptedTargets) {
  const GPTConfig config = model_config();
  GPT model(config);
  ch08::LoraModel lora(model, lora_config());
  EXPECT_EQ(error_naming("adapter(0, \"mlp.fc\") with targets attn.q, attn.v",
                         [&] { lora.adapter(0, "mlp.fc"); }, {"attn.q", "attn.v"}),
            "");
  EXPECT_EQ(error_naming(
                "adapter(" + std::to_string(config.layers) + ", \"attn.q\"), past the last block",
                [&] { lora.adapter(config.layers, "attn.q"); }, {"attn.q", "attn.v"}),
            "");
}

// merge_all twice, or unmerge_all with nothing merged, would fold s B A in
// twice or take out what was never added: both are errors, and the weights
// stay as they were.
TEST(Puzzle8_3_lora_model, MergingTwiceOrUnmergingUnmergedIsAnError) {
  const GPTConfig config = model_config();
  GPT model(config);
  ch08::LoraModel lora(model, lora_config());
  set_every_b(lora, config.layers);
  const Tensor before = model.block(0).attn.q.weight.clone();
  EXPECT_EQ(error_naming("unmerge_all before merge_all", [&] { lora.unmerge_all(); }, {"merge"}),
            "");
  EXPECT_EQ(bitwise("block 0 attn.q.weight after a refused unmerge_all", before,
                    model.block(0).attn.q.weight),
            "");
  lora.merge_all();
  const Tensor merged = model.block(0).attn.q.weight.clone();
  EXPECT_EQ(error_naming("merge_all twice", [&] { lora.merge_all(); }, {"merge"}), "");
  EXPECT_EQ(bitwise("block 0 attn.q.weight after a refused second merge_all", merged,
                    model.block(0).attn.q.weight),
            "");
  EXPECT_TRUE(lora.merged()) << "a refused merge_all must leave the model merged";
}

}  // namespace
}  // namespace dtp
