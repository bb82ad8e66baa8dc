#pragma once
/// \file
/// The embedding primitive: embedding(ids [B] or [B, S] or [B, S, T] of i64, table [V, H])
/// -> [ids.., H], row ids[i] of the table for each id.
///
/// Sharding: ops/embedding.hpp's `embedding_rule`. The ids keep their splits (the batch's,
/// data parallel by default) and the table gives up the axes the ids use; the result is laid
/// out like the ids, then like the table's H. A table split by rows (the vocabulary, Megatron's
/// vocab-parallel embedding) makes the result a pending sum over the vocabulary's axes: each
/// rank looks up the ids in its block of rows (zeros for the others), and the sum resolves on
/// the edge to a consumer that needs whole rows. The ids are checked against V on every rank
/// (one agreement over the mesh per forward pass, as the cross-entropy's labels).
///
/// VJP: the table's cotangent scatter-adds each cotangent row to its id's row (each rank its
/// ids' terms, into its block of rows); the ids, integers, have none (the schedule asks
/// cotangents of floating values only).

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/ops/embedding.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard::detail {

XSHARD_DECL std::vector<result_spec> infer_embedding(const op_attributes&,
                                                     std::span<const operand_type> ops);

XSHARD_DECL layout_choice embedding_layouts(const op_attributes&, std::span<const operand_type>,
                                            std::vector<layout> asked, const mesh_shape&);

inline bool embedding_batched(const op_attributes&, std::span<const operand_type> ops,
                              std::size_t i) {
    return i == 0 && !ops[0].is_weight;
}

inline double embedding_flops(const op_attributes&, std::span<const shard_type>,
                              std::span<const shard_type> results) {
    return double(results[0].count());
}

inline constexpr op_rules embedding_rules{.name = "embedding",
                                          .infer = infer_embedding,
                                          .rule = embedding_layouts,
                                          .batched = embedding_batched,
                                          .resolve = resolve_each,
                                          .flops = embedding_flops,
                                          .saves = saves_operand(0)};

/// This rank's block of table rows: [first, first + count).
struct row_block {
    std::size_t first = 0, count = 0, width = 0;
    explicit row_block(const node_shards& s) {
        const auto b = s.operand_block<2>(1);
        first = b.offset[0];
        count = b.extent[0];
        width = b.extent[1];
    }
    bool holds(std::int64_t id) const {
        return id >= std::int64_t(first) && id < std::int64_t(first + count);
    }
};

template <class T>
void embedding_kernel(const forward_args& x) {
    const auto& s = x.shards;
    const auto* ids = static_cast<const std::int64_t*>(x.operands[0]);
    const T* table = static_cast<const T*>(x.operands[1]);
    T* y = static_cast<T*>(x.results[0]);
    const std::size_t n = s.operands[0].count(), vocabulary = s.operands[1].global[0];
    std::optional<std::string> bad;
    for (std::size_t i = 0; i < n && !bad; ++i)
        if (ids[i] < 0 || std::size_t(ids[i]) >= vocabulary)
            bad = "xshard: " + s.node->name + " (embedding): id " + std::to_string(ids[i]) +
                  " is not one of the table's " + std::to_string(vocabulary) + " rows";
    agree_on_error(s.mesh->group(s.mesh->shape.all_axes()), bad);
    const row_block rows(s);
    for (std::size_t i = 0; i < n; ++i) {
        T* out = y + i * rows.width;
        if (rows.holds(ids[i]))
            std::copy_n(table + (std::size_t(ids[i]) - rows.first) * rows.width, rows.width, out);
        else
            std::fill_n(out, rows.width, T(0));
    }
}

/// dtable[id] += dy[i] for each of this rank's ids in its block of rows.
template <class T>
void embedding_vjp(const vjp_args& v) {
    T* dt = static_cast<T*>(v.operand_cotangents[1]);
    if (!dt)
        return;
    const auto& s = v.shards;
    if (!v.accumulate[1])
        std::fill_n(dt, s.operands[1].count(), T(0));
    const T* dy = static_cast<const T*>(v.result_cotangents[0]);
    if (!dy)
        return;
    const auto* ids = static_cast<const std::int64_t*>(v.operands[0]);
    const row_block rows(s);
    const std::size_t n = s.operands[0].count();
    for (std::size_t i = 0; i < n; ++i) {
        if (!rows.holds(ids[i]))
            continue;
        T* row = dt + (std::size_t(ids[i]) - rows.first) * rows.width;
        const T* g = dy + i * rows.width;
        for (std::size_t j = 0; j < rows.width; ++j)
            row[j] += g[j];
    }
}

template <class T>
void register_embedding(auto&& add) {
    add(primitive<T>{&embedding_rules, embedding_kernel<T>, embedding_vjp<T>});
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/graph/primitives/embedding.ipp>
#endif
