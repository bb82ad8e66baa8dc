#pragma once
/// \file
/// Vocabulary-parallel embedding lookup and cross-entropy (Megatron's vocab-parallel ops).
///
/// embedding(ids, table): table [V, H] with the vocabulary split over axes A; each rank looks
/// up the ids that fall in its vocabulary block (zeros for the others), and one all-reduce
/// over A completes the rows. The output [ids.., H] is laid out like the ids, then like the
/// table's H. The ids and the table must not share mesh axes.
///
/// cross_entropy(logits, labels): logits [B, V] with the classes split over axes A, labels [B]
/// (integers) laid out like the logits' batch (a replicated label vector is sliced). Per row,
/// log sum_c exp(x_c) - x_label from three all-reduces over A of one value per row (the max,
/// the sum of exponentials, the target logit); the logits are never gathered. The output [B]
/// is laid out like the batch.
///
/// Both also take traced tensors (ops/annotated.hpp), recorded in the program being traced.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <cmath>
#include <concepts>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

namespace xshard {

/// embedding's rule: the output is [ids dims.., H]; the table gives up the axes the ids use.
constexpr rule_result embedding_rule(const layout& ids, const layout& table) {
    rule_result r{ids, table, layout::replicated(ids.rank() + 1)};
    if (table.rank() != 2)
        return detail::fail(r, rule_problem::rank_mismatch);
    if (ids.is_partial() || table.is_partial()) {
        r = detail::fail(r, rule_problem::nonlinear_partial);
        r.a.partial.clear();
        r.b.partial.clear();
    }
    for (auto& d : r.b.dims) {
        dim_axes kept;
        for (const auto& x : d) {
            if (r.a.uses(x))
                r = detail::fail(r, rule_problem::axis_conflict);
            else
                kept.push_back(x);
        }
        d = kept;
    }
    for (std::size_t d = 0; d < ids.rank(); ++d)
        r.out.dims[d] = r.a.dims[d];
    r.out.dims[ids.rank()] = r.b.dims[1];
    return r;
}

/// cross_entropy's rule: labels laid out like the logits' batch; the output [B] too.
constexpr rule_result cross_entropy_rule(const layout& logits, const layout& labels) {
    rule_result r{logits, labels, layout::replicated(1)};
    if (logits.rank() != 2 || labels.rank() != 1)
        return detail::fail(r, rule_problem::rank_mismatch);
    if (logits.is_partial() || labels.is_partial()) {
        r = detail::fail(r, rule_problem::nonlinear_partial);
        r.a.partial.clear();
        r.b.partial.clear();
    }
    dim_axes batch;
    if (!detail::merge_dim(logits.dims[0], labels.dims[0], batch))
        r = detail::fail(r, rule_problem::split_mismatch);
    r.a.dims[0] = r.b.dims[0] = r.out.dims[0] = batch;
    if (detail::uses_twice(r.a))
        r = detail::fail(r, rule_problem::axis_conflict);
    return r;
}

namespace detail {

struct embedding_rule_fn {
    constexpr rule_result operator()(const layout& i, const layout& t) const {
        return embedding_rule(i, t);
    }
};
struct cross_entropy_rule_fn {
    constexpr rule_result operator()(const layout& x, const layout& y) const {
        return cross_entropy_rule(x, y);
    }
};

/// Every rank of `c` throws if any rank holds a class index outside [0, classes), with the
/// message of the lowest such rank (its rank and the first bad value): checked before any
/// rank uses the labels. Collective: one all-reduce of one int (two broadcasts more on
/// failure).
template <class Labels>
void check_labels(const communicator& c, const Labels& labels, std::size_t classes,
                  const char* operation) {
    std::optional<std::string> bad;
    for (auto y : labels)
        if (y < 0 || static_cast<std::make_unsigned_t<decltype(y)>>(y) >= classes) {
            bad = std::string("xshard: ") + operation + ": rank " + std::to_string(c.rank()) +
                  " holds label " + std::to_string(y) + ", outside [0, " +
                  std::to_string(classes) + ")";
            break;
        }
    agree_on_error(c, bad);
}

/// One rank's term of an embedding: for each of its ids (any shape, R - 1 dimensions) the row
/// of its block `tb` of the table (`lt` local) holding it, zeros for ids outside the block.
template <std::size_t R, class Ids, class Table, class Box>
auto embedding_rows(const Ids& li, const Table& lt, const Box& tb) {
    using T = typename Table::value_type;
    auto extent = detail::to_array<R>(li.shape());
    extent[R - 1] = tb.extent[1];
    auto local = xt::xtensor<T, R>::from_shape(extent);
    const std::size_t width = tb.extent[1];
    for (std::size_t i = 0; i < li.size(); ++i) {
        const auto v = std::size_t(li.data()[i]);
        T* row = local.data() + i * width;
        if (v >= tb.offset[0] && v < tb.offset[0] + tb.extent[0])
            std::copy_n(lt.data() + (v - tb.offset[0]) * width, width, row);
        else
            std::fill_n(row, width, T{});
    }
    return local;
}

/// The adjoint of `embedding_rows`: adds row i of `dz` (one per id) to the row of `grad` (the
/// table's block `tb`, local) holding id i, for the ids inside the block.
template <class Grad, class Ids, class Dz, class Box>
void add_embedding_rows(Grad& grad, const Ids& ids, const Dz& dz, const Box& tb) {
    const std::size_t width = tb.extent[1];
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto v = std::size_t(ids.data()[i]);
        if (v >= tb.offset[0] && v < tb.offset[0] + tb.extent[0])
            for (std::size_t j = 0; j < width; ++j)
                grad(v - tb.offset[0], j) += dz.data()[i * width + j];
    }
}

} // namespace detail

namespace ops {

/// Looks up rows of `table` [V, H] for integer `ids` (see the file comment). Collective: one
/// all-reduce over the vocabulary axes (and one of an int to check the ids on every rank).
template <distributed_tensor I, distributed_tensor W>
auto embedding(const I& ids, const W& table) {
    using T = typename W::value_type;
    using Id = typename I::value_type;
    static_assert(std::integral<Id>, "xshard: embedding ids must be integers");
    static_assert(std::is_same_v<typename I::mesh_type, typename W::mesh_type>,
                  "xshard: embedding: the ids and the table live on meshes of different types");
    constexpr std::size_t R = I::rank + 1;
    using rule = detail::rule_for<detail::embedding_rule_fn, I, W>;
    const auto& res = rule::get("embedding", ids, table);
    const auto pi = detail::prepare(ids, res.a, rule::may_redistribute, "embedding");
    const auto pt = detail::prepare(table, res.b, rule::may_redistribute, "embedding");
    const auto& li = pi.get();
    const auto& lt = pt.get();
    const auto& mesh = ids.mesh();
    detail::check_labels(mesh.comm(), li, table.shape()[0], "embedding");
    const auto tb = block_of(res.b, mesh.shape(), table.shape(), mesh.rank());
    std::array<std::size_t, R> shape{};
    for (std::size_t d = 0; d + 1 < R; ++d)
        shape[d] = ids.shape()[d];
    shape[R - 1] = table.shape()[1];
    auto local = detail::embedding_rows<R>(li, lt, tb);
    const auto vocab = res.b.split_axes(0, mesh.shape());
    if (!vocab.empty() && local.size() > 0)
        allreduce(mesh.sub(vocab), std::span(local.data(), local.size()), reduction::sum);
    using result = detail::result_t<T, typename I::mesh_type, rule::is_static, rule::value.out, R>;
    return result(detail::unchecked, mesh, shape, std::move(local), res.out);
}

} // namespace ops

namespace detail {

/// Per row of logits split by classes: the maximum, the sum of exp(x - max) and the label's
/// logit, each all-reduced over the class axes (three all-reduces of one value per row).
template <class T>
struct softmax_row_stats {
    xt::xtensor<T, 1> max, sum_exp, target;
};

/// The row statistics of this rank's block `x` (at `xb` in logits laid out as `l`) against
/// the labels `y` of its rows.
template <class Mesh, class X, class Y, class Box>
auto softmax_rows(const Mesh& mesh, const layout& l, const X& x, const Y& y, const Box& xb) {
    using T = typename X::value_type;
    const std::size_t rows = xb.extent[0], cols = xb.extent[1];
    softmax_row_stats<T> r{xt::xtensor<T, 1>::from_shape({rows}), xt::zeros<T>({rows}),
                           xt::zeros<T>({rows})};
    const auto classes = l.split_axes(1, mesh.shape());
    auto reduce = [&](auto& v, reduction op) {
        if (!classes.empty() && rows > 0)
            allreduce(mesh.sub(classes), std::span(v.data(), v.size()), op);
    };
    for (std::size_t i = 0; i < rows; ++i) {
        T mi = std::numeric_limits<T>::lowest();
        for (std::size_t j = 0; j < cols; ++j)
            mi = std::max(mi, x(i, j));
        r.max(i) = mi;
    }
    reduce(r.max, reduction::max);
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j)
            r.sum_exp(i) += std::exp(x(i, j) - r.max(i));
        const auto c = std::size_t(y(i));
        if (c >= xb.offset[1] && c < xb.offset[1] + cols)
            r.target(i) = x(i, c - xb.offset[1]);
    }
    reduce(r.sum_exp, reduction::sum);
    reduce(r.target, reduction::sum);
    return r;
}

} // namespace detail

namespace ops {

/// The cross-entropy of each row of `logits` [B, V] against integer `labels` [B] (see the
/// file comment). Collective: three all-reduces over the class axes of one value per row.
template <distributed_tensor X, distributed_tensor Y>
auto cross_entropy(const X& logits, const Y& labels) {
    using T = typename X::value_type;
    static_assert(std::integral<typename Y::value_type>,
                  "xshard: cross_entropy labels must be integers");
    static_assert(std::is_same_v<typename X::mesh_type, typename Y::mesh_type>,
                  "xshard: cross_entropy: the operands live on meshes of different types");
    using rule = detail::rule_for<detail::cross_entropy_rule_fn, X, Y>;
    const auto& res = rule::get("cross_entropy", logits, labels);
    const auto px = detail::prepare(logits, res.a, rule::may_redistribute, "cross_entropy");
    const auto py = detail::prepare(labels, res.b, rule::may_redistribute, "cross_entropy");
    const auto& x = px.get();
    const auto& y = py.get();
    const auto& mesh = logits.mesh();
    if (logits.shape()[0] != labels.shape()[0])
        throw error("xshard: cross_entropy: " + detail::shape_string(logits.shape()) +
                    " logits for " + detail::shape_string(labels.shape()) + " labels");
    detail::check_labels(mesh.comm(), y, logits.shape()[1], "cross_entropy");
    const auto xb = block_of(res.a, mesh.shape(), logits.shape(), mesh.rank());
    const auto rows = detail::softmax_rows(mesh, res.a, x, y, xb);
    xt::xtensor<T, 1> loss = xt::log(rows.sum_exp) + rows.max - rows.target;
    using result = detail::result_t<T, typename X::mesh_type, rule::is_static, rule::value.out, 1>;
    return result(detail::unchecked, mesh, std::array<std::size_t, 1>{logits.shape()[0]},
                  std::move(loss), res.out);
}

/// On traced tensors (ops/annotated.hpp): the lookup recorded in the program (ids of i64,
/// graph/primitives/embedding.hpp).
template <traced_operand I, traced_operand W>
auto embedding(const I& ids, const W& table) {
    return trace_call("embedding", op_attributes{}, op_annotation{}, ids, table);
}

/// On traced tensors (ops/annotated.hpp): the cross-entropy recorded in the program.
template <traced_operand X, traced_operand Y>
auto cross_entropy(const X& logits, const Y& labels) {
    return trace_call("cross_entropy", op_attributes{}, op_annotation{}, logits, labels);
}

} // namespace ops

} // namespace xshard
