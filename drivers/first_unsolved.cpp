// first_unsolved(): which stub `dtp train` names when a run stopped at one.
// A run calls its puzzles outermost first (4.8's model before 4.4's
// attention), so the stub it stops at is often not the one to solve next;
// the strategy's puzzle_calls() try each puzzle alone, in the chapter's order.
#include <exception>
#include <string>
#include <tuple>

#include "drivers/strategy.h"
#include "dtp/error.h"
#include "dtp/launch.h"

namespace dtp::drivers {

namespace {

// "4.8" of "puzzle 4.8 tensor_parallel_gpt is not solved yet" or of "4.8",
// as (chapter, number, letters) for ordering; (-1, -1, "") when it has none.
std::tuple<int, int, std::string> puzzle_order(const std::string& text) {
  const std::string prefix = "puzzle ";
  std::size_t at = text.rfind(prefix, 0) == 0 ? prefix.size() : 0;
  int chapter = 0, number = 0;
  std::size_t used = 0;
  try {
    chapter = std::stoi(text.substr(at), &used);
    at += used;
    if (at >= text.size() || text[at] != '.') return {-1, -1, ""};
    number = std::stoi(text.substr(at + 1), &used);
    at += 1 + used;
  } catch (const std::exception&) {
    return {-1, -1, ""};
  }
  std::string letters;
  while (at < text.size() && text[at] >= 'a' && text[at] <= 'z') letters += text[at++];
  return {chapter, number, letters};
}

// The NotSolved message of @p call, or "" when it is not a stub.
std::string stub_message(const PuzzleCall& call) {
  World world;
  world.size = 1;
  world.backend = Backend::thread;
  world.device = Device::cpu();
  world.timeout_seconds = 5;
  try {
    launch(world, call.call);
  } catch (const RankFailure& failure) {
    try {
      failure.rethrow_original();
    } catch (const NotSolved& stub) {
      return stub.what();
    } catch (...) {
    }
  } catch (const std::exception&) {
  }
  return "";
}

}  // namespace

GPTConfig tiny_probe_config() {
  GPTConfig tiny;
  tiny.vocab_size = 8;
  tiny.context = 4;
  tiny.d_model = 8;
  tiny.heads = 2;
  tiny.layers = 1;
  return tiny;
}

std::string first_unsolved(const Strategy& strategy, const TrainConfig& config,
                           const std::string& stopped_at) {
  const auto stopped = puzzle_order(stopped_at);
  for (const PuzzleCall& call : strategy.puzzle_calls(config)) {
    if (std::get<0>(stopped) >= 0 && !(puzzle_order(call.puzzle) < stopped)) break;
    const std::string message = stub_message(call);
    if (!message.empty()) return message;
  }
  return stopped_at;
}

}  // namespace dtp::drivers
