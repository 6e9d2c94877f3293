// The mesh's shape in words (provided, not a puzzle).
#include "12_3d_parallelism/three_d.h"

namespace dtp::ch12 {

std::string MeshShape::text() const {
  return "dp " + std::to_string(dp) + " x pp " + std::to_string(pp) + " x tp " + std::to_string(tp);
}

}  // namespace dtp::ch12
