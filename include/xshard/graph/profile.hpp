#pragma once
/// \file
/// Where a compiled program's step time goes on one rank: per node, the seconds of its kernel
/// (the forward pass), of its VJP and of the recomputed kernels (the backward pass), and of
/// the redistributions around it, summed over the passes run while profiling was on
/// (`compiled_program::profile_steps`). The search's predicted seconds per node
/// (`node_strategy::compute` and `communication`) price the same parts, so the two can be
/// set side by side.
///
/// A redistribution belongs to the node it serves: in the forward pass, the next kernel (its
/// operands' moves run just before it); in the backward pass, the VJP before it (the moves of
/// that VJP's operand cotangents, and the sums of cotangents that meet), or, before the first
/// VJP, the next one.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace xshard {

/// One node's measured seconds (see the file comment).
struct node_time {
    std::string node; ///< the node's name
    std::string op;   ///< its primitive (or custom node's name)
    double forward = 0, backward = 0, redistribution = 0;

    double seconds() const noexcept { return forward + backward + redistribution; }
};

/// A compiled program's step time on this rank, node by node, over `forward_passes` forward
/// and `backward_passes` backward passes. Each rank measures its own; the ranks of a
/// collective wait for each other, so a node's seconds include the wait for the slowest.
struct program_profile {
    std::vector<node_time> nodes;
    std::size_t forward_passes = 0, backward_passes = 0;

    /// Every node's seconds, summed.
    double seconds() const noexcept {
        double s = 0;
        for (const auto& n : nodes)
            s += n.seconds();
        return s;
    }

    /// The seconds per node summed over nodes of the same primitive, largest first.
    std::vector<node_time> by_op() const {
        std::vector<node_time> ops;
        for (const auto& n : nodes) {
            auto it = std::find_if(ops.begin(), ops.end(),
                                   [&](const node_time& o) { return o.op == n.op; });
            if (it == ops.end()) {
                ops.push_back({n.op, n.op, 0, 0, 0});
                it = ops.end() - 1;
            }
            it->forward += n.forward;
            it->backward += n.backward;
            it->redistribution += n.redistribution;
        }
        std::stable_sort(ops.begin(), ops.end(), [](const node_time& a, const node_time& b) {
            return a.seconds() > b.seconds();
        });
        return ops;
    }

    /// A table of the `top` nodes that took longest (every node when `top` is 0), in
    /// milliseconds per step (the seconds over `forward_passes`), then the same summed per
    /// primitive.
    std::string report(std::size_t top = 0) const {
        auto sorted = nodes;
        std::stable_sort(sorted.begin(), sorted.end(), [](const node_time& a, const node_time& b) {
            return a.seconds() > b.seconds();
        });
        if (top != 0 && sorted.size() > top)
            sorted.resize(top);
        const double passes = double(std::max<std::size_t>(forward_passes, 1));
        std::string s = "profile over " + std::to_string(forward_passes) + " forward and " +
                        std::to_string(backward_passes) +
                        " backward passes; ms per step (per forward pass): forward, backward, "
                        "redistribution, share of the total\n";
        const double total = seconds();
        auto line = [&](const node_time& n) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "%9.3f %9.3f %9.3f %5.1f%%  ", 1e3 * n.forward / passes,
                          1e3 * n.backward / passes, 1e3 * n.redistribution / passes,
                          total > 0 ? 100 * n.seconds() / total : 0.0);
            return std::string(buf);
        };
        for (const auto& n : sorted)
            s += line(n) + n.node + " (" + n.op + ")\n";
        s += "summed per primitive:\n";
        for (const auto& n : by_op())
            s += line(n) + n.op + "\n";
        return s;
    }
};

} // namespace xshard
