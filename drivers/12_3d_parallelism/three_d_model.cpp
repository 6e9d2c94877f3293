// This rank's part of a GPT on a 3D mesh: chapter 04's tensor-parallel units
// of its pipeline stages, run by chapter 05's StageModule through a runner
// that knows those units. Provided code, not a puzzle.
#include <any>

#include "12_3d_parallelism/three_d.h"
#include "dtp/memory.h"

namespace dtp::ch12 {

using ch04::TensorParallelBlock;
using ch04::TensorParallelBlockSaved;
using ch04::TensorParallelEmbedding;
using ch04::TensorParallelHead;
using ch04::TensorParallelHeadSaved;
using ch04::VocabParallelEmbeddingSaved;

std::vector<ch05::UnitRange> three_d_partition(int layers, int virtual_stages) {
  DTP_CHECK(virtual_stages >= 1 && layers >= 1 && layers % virtual_stages == 0,
            "three_d_partition: ", layers, " layers do not split into ", virtual_stages,
            " virtual stages (pp x chunks) of equal whole layers");
  const int per = layers / virtual_stages;
  std::vector<ch05::UnitRange> ranges;
  for (int v = 0; v < virtual_stages; ++v) {
    // Units: 0 the embedding, 1..L the blocks, L + 1 the head.
    const int first = v == 0 ? 0 : 1 + v * per;
    const int last = v + 1 == virtual_stages ? layers + 1 : (v + 1) * per;  // inclusive
    ranges.push_back({first, last - first + 1});
  }
  return ranges;
}

// The tensor-parallel GPT's units as a chapter 05 stage runs them. Units of
// stages this rank does not hold stay empty.
class ThreeDModel::Runner : public ch05::StageRunner {
 public:
  Runner(Comm& tp, const GPT& full, const std::vector<bool>& held, const ThreeDOptions& options)
      : tp_(tp), config_(full.config()), options_(options) {
    const ch04::TensorParallelOptions tp_options{options.sequence_parallel};
    std::vector<const Unit*> serial = full.units();
    units_.resize(serial.size());
    for (std::size_t u = 0; u < serial.size(); ++u) {
      if (!held[u]) continue;
      if (u == 0)
        units_[u] = std::make_unique<TensorParallelEmbedding>(
            tp, dynamic_cast<const Embedding&>(*serial[u]), tp_options);
      else if (u + 1 == serial.size())
        units_[u] = std::make_unique<TensorParallelHead>(tp, dynamic_cast<const Head&>(*serial[u]),
                                                         tp_options);
      else
        units_[u] = std::make_unique<TensorParallelBlock>(
            tp, dynamic_cast<const Block&>(*serial[u]), tp_options);
    }
  }

  int unit_count() const override { return static_cast<int>(units_.size()); }
  Unit* unit(int u) override { return units_[static_cast<std::size_t>(u)].get(); }

  Tensor forward(int u, const Tensor& x, const ch05::MicroBatch& microbatch, std::any& saved,
                 double& loss) override {
    Unit* unit = this->unit(u);
    if (auto* embedding = dynamic_cast<TensorParallelEmbedding*>(unit))
      return embedding->layer.forward(x, saved.emplace<VocabParallelEmbeddingSaved>());
    const std::int64_t sequences = microbatch.inputs.size(0);
    if (auto* block = dynamic_cast<TensorParallelBlock*>(unit)) {
      if (!options_.recompute)
        return block->forward(x, saved.emplace<TensorParallelBlockSaved>(), sequences);
      // Full recomputation: keep the input alone; what the forward saved
      // is freed as it returns.
      saved.emplace<Input>(Input{x, sequences});
      TensorParallelBlockSaved dropped;
      return block->forward(x, dropped, sequences);
    }
    // The head: LayerNorm on this rank's tokens, the vocabulary-split LM
    // head (which gathers the tokens under sequence parallelism), the loss.
    auto& head = dynamic_cast<TensorParallelHead&>(*unit);
    auto& kept = saved.emplace<TensorParallelHeadSaved>();
    Tensor h = head.ln.forward(x, kept.ln);
    Tensor logits = head.lm.forward(h, kept.lm);
    loss = head.loss.forward(logits, microbatch.targets, kept.loss);
    return Tensor();
  }

  Tensor backward(int u, const Tensor& dy, std::any& saved, WeightGrads mode,
                  double loss_scale) override {
    DTP_CHECK(mode == WeightGrads::immediate,
              "3D step: chapter 04's units do not defer weight gradients (zb-h1)");
    Unit* unit = this->unit(u);
    if (auto* head = dynamic_cast<TensorParallelHead*>(unit)) {
      auto& kept = std::any_cast<TensorParallelHeadSaved&>(saved);
      Tensor dlogits = head->loss.backward(kept.loss, loss_scale);
      Tensor dh = head->lm.backward(dlogits, kept.lm);
      return head->ln.backward(dh, kept.ln);
    }
    if (auto* block = dynamic_cast<TensorParallelBlock*>(unit)) {
      if (!options_.recompute)
        return block->backward(dy, std::any_cast<TensorParallelBlockSaved&>(saved));
      const Input& kept = std::any_cast<Input&>(saved);
      TensorParallelBlockSaved again;
      {
        RecomputeScope scope;
        block->forward(kept.x, again, kept.sequences);
      }
      return block->backward(dy, again);
    }
    dynamic_cast<TensorParallelEmbedding&>(*unit).layer.backward(
        dy, std::any_cast<VocabParallelEmbeddingSaved&>(saved));
    return Tensor();
  }

  void weight(int, std::any&) override {
    throw Error("3D step: chapter 04's units do not defer weight gradients (zb-h1)");
  }

  // Under sequence parallelism a stage's output is its token shard.
  Tensor boundary_tensor(const ch05::MicroBatch& microbatch, bool gradient) const override {
    const std::int64_t b = microbatch.inputs.size(0), seq = microbatch.inputs.size(1);
    const Shape shape = options_.sequence_parallel ? Shape{b * seq / tp_.size(), config_.d_model}
                                                   : Shape{b, seq, config_.d_model};
    return Tensor::empty(shape, config_.dtype, config_.device,
                         gradient ? MemoryCategory::other : MemoryCategory::activations);
  }

 private:
  // What a recomputed block keeps: its input.
  struct Input {
    Tensor x;
    std::int64_t sequences;
  };
  Comm& tp_;
  GPTConfig config_;
  ThreeDOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
};

ThreeDModel::ThreeDModel(Mesh& mesh, const GPT& full, const ThreeDOptions& options)
    : mesh_(mesh), config_(full.config()), options_(options) {
  const int p = mesh.pp.size(), v = options.chunks, t = mesh.tp.size();
  const GPTConfig& c = config_;
  DTP_CHECK(c.heads % t == 0, "3D model: ", c.heads, " heads do not split over tp ", t,
            " (each rank computes whole heads)");
  DTP_CHECK(c.vocab_size % t == 0, "3D model: the vocabulary of ", c.vocab_size,
            " does not split over tp ", t, " (vocabulary-parallel embedding and loss)");
  DTP_CHECK(std::int64_t{c.mlp_ratio} * c.d_model % t == 0, "3D model: the MLP width ",
            std::int64_t{c.mlp_ratio} * c.d_model, " does not split over tp ", t);
  DTP_CHECK(options.schedule != ch05::ScheduleKind::zb_h1,
            "3D model: zb-h1 splits the backward into B and W, which chapter 04's units do not; "
            "use afab, 1f1b or interleaved");
  DTP_CHECK(options.microbatches >= 1, "3D model: micro-batches must be at least 1, got ",
            options.microbatches);
  if (options.schedule == ch05::ScheduleKind::interleaved) {
    DTP_CHECK(v >= 2, "3D model: an interleaved schedule needs chunks >= 2, got ", v);
    DTP_CHECK(options.microbatches % p == 0, "3D model: an interleaved schedule needs the ",
              options.microbatches, " micro-batches to be a multiple of pp ", p);
  } else {
    DTP_CHECK(v == 1, "3D model: ", ch05::schedule_kind_name(options.schedule),
              " runs one chunk per rank, got chunks ", v, " (use interleaved)");
  }
  const std::vector<ch05::UnitRange> ranges = three_d_partition(c.layers, p * v);
  std::vector<bool> held(static_cast<std::size_t>(c.layers + 2), false);
  for (int chunk = 0; chunk < v; ++chunk) {
    const ch05::UnitRange& r = ranges[static_cast<std::size_t>(chunk * p + mesh.pp_index)];
    for (int u = r.first; u < r.first + r.count; ++u) held[static_cast<std::size_t>(u)] = true;
  }
  runner_ = std::make_shared<Runner>(mesh.tp, full, held, options);
  for (int chunk = 0; chunk < v; ++chunk)
    stages_.push_back(std::make_unique<ch05::StageModule>(
        runner_, ranges[static_cast<std::size_t>(chunk * p + mesh.pp_index)], chunk));
}

ThreeDModel::~ThreeDModel() = default;

const ch05::Schedule& ThreeDModel::schedule() {
  // Built on first use: a model whose gradients are only read (12.3's
  // checkers) needs no schedule, so no chapter 05 schedule puzzle.
  if (schedule_.actions.empty())
    schedule_ = ch05::make_schedule(options_.schedule, mesh_.pp.size(), options_.microbatches,
                                    options_.chunks);
  return schedule_;
}

std::vector<ch05::StageModule*> ThreeDModel::chunks() {
  std::vector<ch05::StageModule*> out;
  for (auto& stage : stages_) out.push_back(stage.get());
  return out;
}

std::vector<Unit*> ThreeDModel::units() {
  std::vector<Unit*> out;
  for (auto& stage : stages_)
    for (Unit* unit : stage->units()) out.push_back(unit);
  return out;
}

std::vector<TensorParallelBlock*> ThreeDModel::blocks() {
  std::vector<TensorParallelBlock*> out;
  for (Unit* unit : units())
    if (auto* block = dynamic_cast<TensorParallelBlock*>(unit)) out.push_back(block);
  return out;
}

TensorParallelHead* ThreeDModel::head() {
  return dynamic_cast<TensorParallelHead*>(runner_->unit(runner_->unit_count() - 1));
}

std::vector<ch05::MicroBatch> ThreeDModel::microbatches(const Batch& batch) const {
  std::vector<ch05::MicroBatch> out = ch05::split_microbatches(batch, options_.microbatches);
  const std::int64_t tokens = out.front().inputs.numel();
  DTP_CHECK(!options_.sequence_parallel || tokens % mesh_.tp.size() == 0,
            "3D model: sequence parallelism splits a micro-batch's ", tokens, " tokens over tp ",
            mesh_.tp.size(), ", which does not divide them");
  return out;
}

void ThreeDModel::zero_grad() {
  for (Unit* unit : units()) unit->zero_grad();
}

}  // namespace dtp::ch12
