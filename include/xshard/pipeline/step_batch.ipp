#pragma once
/// \file
/// The definitions of what pipeline/step_batch.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/step_batch.hpp>

namespace xshard::pipeline::detail {

XSHARD_DECL std::string batch_cut::mismatch() const {
    return "xshard: pipeline: the first stage splits a batch of " + std::to_string(rows) +
           " rows into " + std::to_string(row_blocks) + " row blocks, the last stage " +
           std::to_string(label_rows) + " labels into " + std::to_string(label_blocks) +
           ": micro-batches need as many rows, and block counts of which one divides the "
           "other";
}

} // namespace xshard::pipeline::detail
