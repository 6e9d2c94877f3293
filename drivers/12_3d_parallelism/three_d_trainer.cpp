// One training step on the 3D mesh: the puzzles' gradients, clipping by the
// whole model's norm, and an optimizer update of this rank's slices.
// Provided code, not a puzzle.
#include "drivers/12_3d_parallelism/three_d_trainer.h"

#include <cmath>

#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch12 {

ThreeDTrainer::ThreeDTrainer(const TrainConfig& config, Mesh& mesh, const ThreeDOptions& options)
    : mesh_(mesh) {
  DTP_CHECK(config.batch % mesh.dp.size() == 0 && config.batch >= mesh.dp.size(),
            "3D trainer: the global batch (", config.batch, " sequences) must split into dp ",
            mesh.dp.size(), " equal non-empty slices");
  serial_ = std::make_unique<Trainer>(config, mesh.dp.rank(), mesh.dp.size());
  load_parameters(serial_->model(), config);
  config_ = serial_->config();
  model_ = std::make_unique<ThreeDModel>(mesh, serial_->model(), options);
  for (Unit* unit : serial_->model().units()) unit->set_buffers(Tensor(), Tensor());
  serial_->set_optimizer(make_optimizer(config_, param_buffers(model_->units())));
}

ThreeDTrainer::~ThreeDTrainer() = default;

StepRecord ThreeDTrainer::step() {
  const StepMeter meter;
  StepRecord record;
  record.step = serial_->steps_done() + 1;
  Batch batch = serial_->sampler().batch(serial_->steps_done(), config_.model.device);
  model_->zero_grad();
  const double loss = three_d_step(mesh_, *model_, batch);
  record.grad_norm = clip_grad_norm_3d(mesh_, *model_, config_.grad_clip);
  // The last stage holds each replica's loss: sum over the pipeline (the
  // others hold 0), then the mean over the replicas.
  record.loss = all_reduce_value(mesh_.pp, loss, ReduceOp::sum);
  if (mesh_.dp.size() > 1) record.loss = all_reduce_value(mesh_.dp, record.loss, ReduceOp::avg);
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
  record.lr = config_.schedule().at(serial_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    serial_->optimizer().step(record.lr);
  }
  meter.finish(record, batch.inputs.numel());
  serial_->count_step();
  return record;
}

}  // namespace dtp::ch12
