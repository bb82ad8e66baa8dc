#pragma once
/// \file
/// Which activation slot (chain.hpp) each micro-batch in flight occupies on a stage: a
/// forward pass takes a free slot of its stage (a new one only when none is free), the pass
/// that releases its activations (B, or W when the backward pass is split) frees it, so a
/// stage holds as many slots as it ever has micro-batches in flight.

#include <xshard/compiled.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace xshard::pipeline::detail {

/// The slots of one step on one rank (see the file comment), counting the micro-batches in
/// flight over all its stages.
class activation_slots {
public:
    /// A slot for micro-batch `mb` on stage `stage`, which enters its forward pass.
    std::size_t acquire(int stage, int mb);

    /// The slot micro-batch `mb` occupies on stage `stage` (acquired before).
    std::size_t at(int stage, int mb) const { return slot_of_.at({stage, mb}); }

    /// Frees the slot of micro-batch `mb` on stage `stage`.
    void release(int stage, int mb) {
        const auto node = slot_of_.extract({stage, mb});
        free_[stage].push_back(node.mapped());
        --in_flight_;
    }

    /// The most micro-batches in flight at once so far.
    int peak() const noexcept { return peak_; }

private:
    std::map<std::pair<int, int>, std::size_t> slot_of_; ///< (stage, micro-batch) -> slot
    std::map<int, std::vector<std::size_t>> free_;       ///< per stage
    std::map<int, std::size_t> count_;                   ///< slots made, per stage
    int in_flight_ = 0, peak_ = 0;
};

} // namespace xshard::pipeline::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/slots.ipp>
#endif
