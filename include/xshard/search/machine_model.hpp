#pragma once
/// \file
/// The machine the strategy search prices with (MindSpore's auto-parallel cost model's
/// figures): the alpha-beta links of the redistribution planner, one rank's GEMM speed (and
/// how it falls on narrow shapes), memory bandwidth and cost of transcendental functions, the
/// element size, the optimizer's state, hsdp's threshold and a factor per primitive fitted on
/// a profiled step. The defaults are guesses; search/calibrate.hpp measures the ranks that
/// will run (benchmarks/README.md gives the figures measured against these defaults).

#include <xshard/compiled.hpp>
#include <xshard/redistribute/cost_model.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard {

/// What the search prices with: the alpha-beta links of the redistribution planner
/// (`cost_model`, per kind or per mesh axis), the GEMM speed and memory bandwidth of one rank,
/// the element size, the optimizer's state per weight element, the hsdp threshold, and the
/// factors of primitives' prices fitted on a profiled step.
struct machine_model {
    cost_model links{};
    /// FLOP/s of one rank's large GEMMs (measure_machine fits it: OpenBLAS, one core).
    double gemm_flops = 3.0e10;
    /// The GEMM dimension at which a GEMM runs at half `gemm_flops` (Hockney's n-half): a
    /// GEMM whose smallest of m, n and k is d runs at gemm_flops / (1 + gemm_half_dimension /
    /// d), since packing and the kernels' edges cost per element of the operands, not per
    /// multiply-add. measure_machine fits it from a narrow GEMM and a square one; 0 runs
    /// every GEMM at `gemm_flops`.
    double gemm_half_dimension = 0;
    /// Bytes/s of one rank's elementwise work (read and write).
    double memory_bandwidth = 5.4e9;
    /// Seconds of one transcendental function (exp, log, erf, tanh) per element, in the
    /// elementwise kernels' vectors (measure_machine times erf and exp).
    double transcendental_seconds = 2e-9;
    /// Bytes per element of weights and activations.
    std::size_t element = 4;
    /// Optimizer state, in weight-sized tensors (Adam: 2).
    double optimizer_states = 2;
    /// hsdp's threshold: weights below it (global bytes) stay unsharded (64 KB).
    std::size_t hsdp_threshold_bytes = 64 * 1024;
    /// The fewest data-parallel ranks over which the driver's automatic gradient path
    /// (driver/gradient_path.hpp) shards the update. What the prices above leave out: every
    /// rank of a node updating at once shares the node's memory bandwidth, and xshard's
    /// all-reduce through shared memory costs about its reduce-scatter alone. Fitted on a
    /// 16-core Xeon with ResNet-18 (benchmarks/README.md): the sharded step took 1.07-1.09x
    /// the all-reduce's at 2 ranks, 1.01-1.03x at 4, 0.96-1.00x at 8 and 0.88-0.93x at 16.
    int sharded_update_min_ranks = 8;
    /// Per primitive (by name): its measured compute over its price, which multiplies the
    /// price of its nodes in the search on programs; 1 for a primitive not named.
    /// `calibrate_ops` (search/calibrate.hpp) fits them from a profiled step of the program
    /// itself, on the ranks that run it: what two GEMMs and one update cannot show (a kernel's
    /// own efficiency on its shapes, the ranks' contention).
    std::vector<std::pair<std::string, double>> op_scale{};

    /// Seconds of `flops` of GEMM work whose smallest dimension is `smallest` (see
    /// `gemm_half_dimension`); a `smallest` of 0 means arithmetic of no GEMM, at the peak.
    double gemm_seconds(double flops, double smallest = 0) const {
        const double slowdown = smallest > 0 ? 1 + gemm_half_dimension / smallest : 1;
        return flops * slowdown / gemm_flops;
    }

    /// Seconds of one weight's update and its gradient's zeroing, memory-bound work each step:
    /// the update reads and writes the weight's `weight_bytes` and each optimizer state of
    /// that size and reads the gradient's `gradient_bytes`; the zeroing writes them.
    double update_seconds(double weight_bytes, double gradient_bytes) const {
        return ((2 + 2 * optimizer_states) * weight_bytes + 2 * gradient_bytes) / memory_bandwidth;
    }

    /// The factor of primitive `op`'s price.
    double scale_of(std::string_view op) const;

    /// Sets the factor of primitive `op`'s price.
    void set_scale_of(std::string_view op, double factor);
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/machine_model.ipp>
#endif
