#pragma once
/// \file
/// The definitions of what pipeline/micro_batch.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/micro_batch.hpp>

namespace xshard::pipeline {

XSHARD_DECL std::vector<std::size_t> micro_batch_rows(std::size_t rows, std::size_t blocks, int m) {
    if (m < 1)
        throw error("xshard: a batch needs at least one micro-batch, not " + std::to_string(m));
    const auto mm = static_cast<std::size_t>(m);
    std::vector<std::size_t> out(mm, 0);
    for (std::size_t i = 0; i < mm; ++i) {
        for (std::size_t b = 0; b < blocks; ++b)
            out[i] += block_extent(block_extent(rows, blocks, b), mm, i);
        if (out[i] == 0)
            return {};
        for (std::size_t b = 0; b < blocks; ++b)
            if (block_extent(block_extent(rows, blocks, b), mm, i) !=
                block_extent(out[i], blocks, b))
                return {};
    }
    return out;
}

XSHARD_DECL std::string cut_failure(std::size_t rows, std::size_t blocks, int m) {
    return "a batch of " + std::to_string(rows) + " rows in " + std::to_string(blocks) +
           " row blocks does not cut into " + std::to_string(m) +
           " micro-batches laid out like it; use a batch size that is a multiple of " +
           std::to_string(blocks * std::size_t(m));
}

XSHARD_DECL std::vector<std::size_t> checked_micro_batch_rows(std::size_t rows, std::size_t blocks,
                                                              int m) {
    auto out = micro_batch_rows(rows, blocks, m);
    if (out.empty())
        throw error("xshard: " + cut_failure(rows, blocks, m));
    return out;
}

XSHARD_DECL int fitting_micro_batches(std::size_t rows, std::size_t blocks, int m) {
    m = int(std::min<std::size_t>(std::size_t(std::max(m, 1)),
                                  std::max<std::size_t>(rows / blocks, 1)));
    while (m > 1 && micro_batch_rows(rows, blocks, m).empty())
        --m;
    return m;
}

} // namespace xshard::pipeline

