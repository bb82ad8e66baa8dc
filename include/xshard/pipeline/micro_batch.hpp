#pragma once
/// \file
/// Micro-batches: a batch cut along its rows (dimension 0) into m micro-batches without
/// communication. Each rank cuts its own block of rows into m consecutive chunks (block
/// partition: n/m rows, one more for the first n%m chunks), and micro-batch i is the
/// distributed tensor made of every rank's i-th chunk, laid out as the batch. With the
/// rows whole on every rank (no data parallelism) micro-batch i is global rows
/// [i N/m, (i+1) N/m) of the block partition; with rows split over k data-parallel blocks it
/// is the i-th chunk of each block. The micro-batches' gradients sum to the batch's, and
/// `join_micro_batches` puts micro-batches (or outputs computed from them) back together.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xview.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace xshard::pipeline {

/// The global rows of each micro-batch when a batch of `rows` rows split into `blocks` row
/// blocks is cut into `m` micro-batches (see the file comment); empty when some micro-batch
/// would hold no row (a loss over no rows has no mean) or its chunks do not form the block
/// partition a distributed tensor's rows must have (never so when `rows` is a nonzero
/// multiple of blocks x m). Throws `xshard::error` (every rank alike: it depends on sizes
/// only) when m < 1.
XSHARD_DECL std::vector<std::size_t> micro_batch_rows(std::size_t rows, std::size_t blocks, int m);

/// Why a batch of `rows` rows in `blocks` row blocks does not cut into `m` micro-batches
/// (`micro_batch_rows` is empty), and the batch sizes that do.
XSHARD_DECL std::string cut_failure(std::size_t rows, std::size_t blocks, int m);

/// `micro_batch_rows`, throwing `xshard::error` when the rows do not cut.
XSHARD_DECL std::vector<std::size_t> checked_micro_batch_rows(std::size_t rows, std::size_t blocks,
                                                              int m);

/// The most micro-batches, up to `m`, that a batch of `rows` rows in `blocks` row blocks cuts
/// into with rows in each (inference takes batches of any size); 1 always does.
XSHARD_DECL int fitting_micro_batches(std::size_t rows, std::size_t blocks, int m);

/// The m micro-batches of `t` (see the file comment): local work only, the same layout as
/// `t`. With `blocks` (a multiple of the row blocks of `t`; 0: as many), the batch is cut as
/// if its rows were split into `blocks` blocks: each rank's block is cut into its share of
/// them first, so that two stages whose tensors split the rows differently (the batch on
/// the first, the labels on the last) cut the same rows into each micro-batch; then the rows
/// must be a multiple of `blocks`. Throws `xshard::error` on every rank alike when `t` has a
/// pending sum or the rows do not cut (see `checked_micro_batch_rows`).
template <distributed_tensor D>
std::vector<D> split_micro_batches(const D& t, int m, std::size_t blocks = 0) {
    if (t.layout().is_partial())
        throw error("xshard: micro-batches of a tensor with a pending sum " +
                    t.layout().to_string());
    const auto& ms = t.mesh().shape();
    const std::size_t rows = t.shape()[0];
    const auto own = static_cast<std::size_t>(t.layout().split_count(0, ms));
    if (blocks == 0)
        blocks = own;
    if (blocks % own != 0)
        throw error("xshard: micro-batches: a batch in " + std::to_string(own) +
                    " row blocks cannot be cut as " + std::to_string(blocks) + " blocks");
    const std::size_t q = blocks / own; // sub-blocks per local block
    if (q > 1 && rows % blocks != 0)
        throw error("xshard: micro-batches: a batch of " + std::to_string(rows) + " rows cut as " +
                    std::to_string(blocks) + " row blocks (the other end of " +
                    "the pipeline splits its rows so) needs a multiple of " +
                    std::to_string(blocks) + " rows");
    const auto sizes = checked_micro_batch_rows(rows, blocks, m);
    const std::size_t local_rows = t.local().shape()[0];
    std::vector<D> out;
    out.reserve(sizes.size());
    std::size_t begin = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        auto shape = t.shape();
        shape[0] = sizes[i];
        typename D::local_type chunk;
        if (q == 1) {
            const std::size_t n = block_extent(local_rows, sizes.size(), i);
            chunk = xt::view(t.local(), xt::range(begin, begin + n));
            begin += n;
        } else {
            auto local_shape = t.local().shape();
            std::size_t n = 0;
            for (std::size_t b = 0; b < q; ++b)
                n += block_extent(block_extent(local_rows, q, b), sizes.size(), i);
            local_shape[0] = n;
            chunk = D::local_type::from_shape(local_shape);
            std::size_t at = 0;
            for (std::size_t b = 0; b < q; ++b) {
                const std::size_t sub = block_extent(local_rows, q, b);
                const std::size_t from =
                    block_offset(local_rows, q, b) + block_offset(sub, sizes.size(), i);
                const std::size_t k = block_extent(sub, sizes.size(), i);
                xt::view(chunk, xt::range(at, at + k)) =
                    xt::view(t.local(), xt::range(from, from + k));
                at += k;
            }
        }
        out.emplace_back(xshard::detail::unchecked, t.mesh(), shape, std::move(chunk), t.layout());
    }
    return out;
}

/// The batch whose micro-batches (those of `split_micro_batches` on a batch in `blocks` row
/// blocks, or any tensors computed from them row by row, like a model's outputs) are
/// `parts`: local work only. Every part must have the same layout, and the same extents but
/// the rows; its rows split into `blocks` blocks (each rank's chunks are then consecutive
/// rows of its block) or whole (each rank then places the rows of every micro-batch's
/// blocks). Throws `xshard::error` (every rank alike: it depends on layouts and sizes only)
/// otherwise.
template <distributed_tensor D>
D join_micro_batches(const std::vector<D>& parts, std::size_t blocks) {
    if (parts.empty())
        throw error("xshard: micro-batches: nothing to join");
    const auto& first = parts.front();
    const auto& ms = first.mesh().shape();
    const auto split = static_cast<std::size_t>(first.layout().split_count(0, ms));
    auto shape = first.shape();
    shape[0] = 0;
    for (const auto& p : parts) {
        auto other = p.shape();
        other[0] = 0;
        if (!(p.layout() == first.layout()) || other != shape)
            throw error("xshard: micro-batches: the parts to join differ in layout or extents (" +
                        first.layout().to_string() + ", " + p.layout().to_string() + ")");
    }
    if (split != blocks && split != 1)
        throw error("xshard: micro-batches: parts whose rows are split into " +
                    std::to_string(split) + " blocks cannot be joined into a batch of " +
                    std::to_string(blocks) + " row blocks; split them alike, or not at all");
    auto local_shape = first.local().shape();
    local_shape[0] = 0;
    for (const auto& p : parts) {
        shape[0] += p.shape()[0];
        local_shape[0] += p.local().shape()[0];
    }
    auto out = D::local_type::from_shape(local_shape);
    std::size_t at = 0;
    // Rows split alike: each rank's chunks in turn. Whole rows: block b of every part in
    // turn, for each of the batch's blocks b.
    const std::size_t passes = split == 1 ? blocks : 1;
    for (std::size_t b = 0; b < passes; ++b)
        for (const auto& p : parts) {
            const std::size_t rows = p.local().shape()[0];
            const std::size_t from = split == 1 ? block_offset(rows, blocks, b) : 0;
            const std::size_t n = split == 1 ? block_extent(rows, blocks, b) : rows;
            xt::view(out, xt::range(at, at + n)) = xt::view(p.local(), xt::range(from, from + n));
            at += n;
        }
    return D(xshard::detail::unchecked, first.mesh(), shape, std::move(out), first.layout());
}

} // namespace xshard::pipeline

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/micro_batch.ipp>
#endif
