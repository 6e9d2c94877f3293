// The tiers of links the benchmarks charge to the alpha-beta clock, in one
// place: NVLink and InfiniBand as chapters 04 and 06 measure them (H100
// NVLink 4 per direction per GPU; one 400 Gb/s NDR card per GPU), and the
// slower links chapter 10 assumes (round numbers of our own).
#pragma once

#include <string>

namespace dtp::bench {

/// One tier: a message costs alpha_s + bytes / bandwidth_Bps.
struct Tier {
  std::string name;
  double alpha_s;        ///< per message
  double bandwidth_Bps;  ///< per direction per GPU: beta = 1 / bandwidth
};

inline Tier nvlink_tier() { return {"NVLink", 3e-6, 450e9}; }
inline Tier infiniband_tier() { return {"InfiniBand", 8e-6, 50e9}; }
inline Tier ethernet_tier() { return {"Ethernet 10 Gbit/s", 50e-6, 1.25e9}; }
inline Tier wan_tier() { return {"WAN 1 Gbit/s", 20e-3, 0.125e9}; }

}  // namespace dtp::bench
