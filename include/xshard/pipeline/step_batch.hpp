#pragma once
/// \file
/// A step's batch at the two ends of a pipeline: the first stage feeds the micro-batches of
/// the batch, the last stage computes the loss of each micro-batch against the matching
/// micro-batch of the labels, weighed by its share of the rows. Only those two stages hold
/// the tensors (MindSpore's per-stage data loading), and they may split the rows into
/// different numbers of row blocks; so before anything is cut, the ranks agree on the
/// rows and row blocks each end has (`batch_cut`), and both ends cut the same rows into
/// each micro-batch (micro_batch.hpp, with the larger block count).

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/pipeline/micro_batch.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard::pipeline::detail {

/// The rows of a step's batch as the two ends of the pipeline hold them, and the number of
/// row blocks each one's layout splits them into.
struct batch_cut {
    long long rows = 0;         ///< the batch's rows (first stage)
    long long row_blocks = 0;   ///< the batch's row blocks
    long long label_rows = 0;   ///< the labels' rows (last stage)
    long long label_blocks = 0; ///< the labels' row blocks

    /// The row blocks both ends cut their rows as: the larger count.
    long long blocks() const noexcept { return std::max(row_blocks, label_blocks); }

    /// Whether both ends can cut the same rows into each micro-batch: as many rows, and
    /// block counts of which one divides the other.
    bool consistent() const noexcept {
        return rows == label_rows && blocks() % row_blocks == 0 && blocks() % label_blocks == 0;
    }

    /// The sentence for a cut that is not `consistent()`.
    std::string mismatch() const;
};

/// The cut of a step's batch, the same on every rank of `world`: the first stage (`first`)
/// reports its batch `x`, the last (`last`) its `labels` unless the step has none (not
/// `labelled`: inference, whose labels are then taken as cut like the batch), each of which
/// must be there, on `stage_mesh`. Throws `xshard::error` on every rank for `problem` (a
/// misuse found before), for a missing or misplaced tensor, and for a cut that is not
/// consistent. Collective over `world`: one agreement, one all-reduce (max) of four integers.
template <distributed_tensor X, distributed_tensor Labels, mesh_type StageMesh>
batch_cut agree_batch_cut(const communicator& world, const StageMesh& stage_mesh, bool first,
                          bool last, const X* x, const Labels* labels,
                          std::optional<std::string> problem, bool labelled = true) {
    batch_cut mine; // zeros but at the ends: the all-reduce takes the ends' numbers
    // The rows and row blocks of the tensor `t` that stage `end` needs as `what`.
    const auto report = [&](const auto* t, const char* end, const char* what, long long& rows,
                            long long& blocks) {
        if (!t || !(t->mesh() == stage_mesh))
            throw error(std::string("xshard: pipeline: the ") + end + " stage needs the " + what +
                        ", on its stage mesh (" + stage_mesh.shape().to_string() + ")");
        rows = (long long)t->shape()[0];
        blocks = t->layout().split_count(0, stage_mesh.shape());
    };
    agreed_alike(world, [&] {
        if (problem)
            throw error(*problem);
        if (first)
            report(x, "first", "batch", mine.rows, mine.row_blocks);
        if (last && labelled)
            report(labels, "last", "labels", mine.label_rows, mine.label_blocks);
    });
    std::array<long long, 4> all{mine.rows, mine.row_blocks, mine.label_rows, mine.label_blocks};
    mpi::allreduce(world, std::span(all), reduction::max);
    const batch_cut cut{all[0], all[1], labelled ? all[2] : all[0], labelled ? all[3] : all[1]};
    // Every rank sees the same numbers, so every rank throws alike.
    if (!cut.consistent())
        throw error(cut.mismatch());
    return cut;
}

/// A step's micro-batches at the two ends of the pipeline (see the file comment).
template <distributed_tensor X, distributed_tensor Labels>
struct step_batch {
    batch_cut cut;
    int micro_batches = 0;         ///< the count the batch is cut into
    std::vector<X> inputs;         ///< first stage: the batch's micro-batches
    std::vector<Labels> labels;    ///< last stage: the labels' micro-batches
    std::vector<std::size_t> rows; ///< last stage: the rows of each micro-batch

    /// Micro-batch `mb`'s share of the batch's rows (last stage), the weight of its loss.
    template <class V>
    V share(int mb) const {
        return V(double(rows[std::size_t(mb)]) / double(cut.label_rows));
    }
};

/// Agrees on the cut (`agree_batch_cut`) and cuts the batch `x` on the first stage and
/// `labels` on the last (when `labelled`) into `micro_batches` micro-batches each. Without
/// labels (inference) the batch may have any size: it is cut into as many micro-batches, up
/// to `micro_batches`, as fit it (fitting_micro_batches). Throws `xshard::error` on every rank
/// when either fails. Collective over `world`: two agreements, one all-reduce.
template <distributed_tensor X, distributed_tensor Labels, mesh_type StageMesh>
step_batch<X, Labels> make_step_batch(const communicator& world, const StageMesh& stage_mesh,
                                      bool first, bool last, int micro_batches, const X* x,
                                      const Labels* labels, std::optional<std::string> problem,
                                      bool labelled = true) {
    step_batch<X, Labels> b;
    b.cut =
        agree_batch_cut(world, stage_mesh, first, last, x, labels, std::move(problem), labelled);
    const auto blocks = std::size_t(b.cut.blocks());
    b.micro_batches = labelled
                          ? micro_batches
                          : fitting_micro_batches(std::size_t(b.cut.rows), blocks, micro_batches);
    agreed_alike(world, [&] {
        if (first)
            b.inputs = split_micro_batches(*x, b.micro_batches, blocks);
        if (last && labelled) {
            b.rows = checked_micro_batch_rows(std::size_t(b.cut.label_rows), blocks, micro_batches);
            b.labels = split_micro_batches(*labels, micro_batches, blocks);
        }
    });
    return b;
}

} // namespace xshard::pipeline::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/pipeline/step_batch.ipp>
#endif
