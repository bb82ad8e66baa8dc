#pragma once
/// \file
/// The parallel degrees of a training run as the strategy search (search/) chooses them and an
/// operator strategy file (io/operator_strategy_file.hpp) records them: data, tensor and
/// pipeline parallel ranks, micro-batches per step, and the hsdp level.

namespace xshard {

/// The parallel degrees of a candidate: data, tensor and pipeline parallel ranks
/// (dp x tp x pp = the world), micro-batches per step, and the hsdp level (0: none).
struct parallel_degrees {
    int dp = 1, tp = 1, pp = 1;
    int micro_batches = 1;
    int hsdp_level = 0;
    friend constexpr bool operator==(const parallel_degrees&, const parallel_degrees&) = default;
};

} // namespace xshard
