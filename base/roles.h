// SM roles of a persistent fused kernel and their counts; a POD shared by tuner, host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_HD __host__ __device__
#else
#define WEFT_HD
#endif

namespace weft {

enum class Role : int32_t { kCompute = 0, kIntraComm = 1, kInterSend = 2, kInterReduce = 3 };
constexpr int kNumRoles = 4;

inline const char* to_string(Role r) {
  switch (r) {
    case Role::kCompute:
      return "compute";
    case Role::kIntraComm:
      return "intra_comm";
    case Role::kInterSend:
      return "inter_send";
    case Role::kInterReduce:
      return "inter_reduce";
  }
  return "?";
}

// Blocks [0, compute) compute, then intra_comm, inter_send, inter_reduce in that order.
struct RoleCounts {
  int32_t compute = 0;
  int32_t intra_comm = 0;
  int32_t inter_send = 0;
  int32_t inter_reduce = 0;

  WEFT_HD int32_t total() const { return compute + intra_comm + inter_send + inter_reduce; }
  WEFT_HD Role role_of(int32_t block) const {
    if (block < compute) return Role::kCompute;
    if (block < compute + intra_comm) return Role::kIntraComm;
    if (block < compute + intra_comm + inter_send) return Role::kInterSend;
    return Role::kInterReduce;
  }
  // Index of a block among the blocks of its role.
  WEFT_HD int32_t index_in_role(int32_t block) const {
    switch (role_of(block)) {
      case Role::kCompute:
        return block;
      case Role::kIntraComm:
        return block - compute;
      case Role::kInterSend:
        return block - compute - intra_comm;
      case Role::kInterReduce:
        return block - compute - intra_comm - inter_send;
    }
    return -1;
  }
};

}  // namespace weft
