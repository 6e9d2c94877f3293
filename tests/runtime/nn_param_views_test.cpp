// The obvious chapter-02 code compiles and writes through: all-reducing each
// parameter's gradient view changes the unit's flat gradient buffer.
#include <gtest/gtest.h>

#include "dtp/dtp.h"
#include "dtp/nn.h"
#include "support/harness.h"

namespace {

using namespace dtp;

TEST(ParamViews, AllReduceOfAGradientViewWritesTheFlatBuffer) {
  GPTConfig config;
  config.vocab_size = 8;
  config.context = 4;
  config.d_model = 8;
  config.heads = 2;
  config.layers = 1;
  config.dtype = DType::f64;
  dtp::testing::run_ranks(2, [&](Comm& comm) {
    GPT model(config);
    for (Unit* unit : model.units()) unit->grads().fill(comm.rank() + 1.0);
    for (Unit* unit : model.units())
      for (ParamView& p : unit->parameters()) comm.all_reduce(p.grad, ReduceOp::avg);
    for (Unit* unit : model.units()) {
      for (double g : unit->grads().to_vector())
        ASSERT_EQ(g, 1.5) << "rank " << comm.rank() << ", unit '" << unit->name()
                          << "': the mean of 1 and 2 should have been written through the view";
    }
  });
}

}  // namespace
