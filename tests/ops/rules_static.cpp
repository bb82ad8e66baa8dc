// The layout type every operation gives its result when no output layout is named: the
// typed propagation that shard()'s global semantics rests on. Compile time only (no code
// runs): each expected layout is worked out from the operation's documented rule, and a
// wrong rule fails the build with the expression that disagrees.

#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/embedding.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/rules.hpp>
#include <xshard/ops/shape.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <cstdint>
#include <type_traits>

namespace {

using xshard::layout;

using M = xshard::mesh<"dp", "mp">;
using M3 = xshard::mesh<"dp", "mp", "sp">;

/// A tensor of element type T and layout type L on mesh type Mesh, for decltype only.
template <layout L, class T = double, class Mesh = M>
const xshard::dtensor<T, Mesh, L>& t();

/// Whether D is a tensor of element type T on mesh type Mesh with the layout type Expected.
template <class D, layout Expected, class T = double, class Mesh = M>
constexpr bool is = std::is_same_v<std::remove_cvref_t<D>, xshard::dtensor<T, Mesh, Expected>> ||
                    (std::is_same_v<typename std::remove_cvref_t<D>::value_type, T> &&
                     std::is_same_v<typename std::remove_cvref_t<D>::mesh_type, Mesh> &&
                     !std::remove_cvref_t<D>::static_layout.dynamic &&
                     std::remove_cvref_t<D>::static_layout == Expected);

// --- matmul: a [.., i, k] @ b [.., k, j] -> [.., I, J] partial(sum: K) -------------------

// Rows by columns, nothing contracted over a split: no pending sum.
static_assert(is<decltype(xshard::ops::matmul(t<"[dp, -]">(), t<"[-, mp]">())), "[dp, mp]">);
// A split contraction leaves a pending sum over its axis (Megatron's row-parallel layer).
static_assert(
    is<decltype(xshard::ops::matmul(t<"[dp, mp]">(), t<"[mp, -]">())), "[dp, -] partial(sum: mp)">);
// A replicated side is sliced to the other's contraction split, from either side.
static_assert(
    is<decltype(xshard::ops::matmul(t<"[-, mp]">(), t<"[-, -]">())), "[-, -] partial(sum: mp)">);
static_assert(
    is<decltype(xshard::ops::matmul(t<"[-, -]">(), t<"[mp, -]">())), "[-, -] partial(sum: mp)">);
// Contraction over two axes at once.
static_assert(is<decltype(xshard::ops::matmul(t<"[-, (dp,mp)]">(), t<"[(dp,mp), -]">())),
                 "[-, -] partial(sum: dp, mp)">);
// A pending sum times a replicated matrix stays a pending sum.
static_assert(is<decltype(xshard::ops::matmul(t<"[dp, -] partial(sum: mp)">(), t<"[-, -]">())),
                 "[dp, -] partial(sum: mp)">);
// Column-parallel: the weight's output columns stay split.
static_assert(is<decltype(xshard::ops::matmul(t<"[dp, -]">(), t<"[-, mp]">())), "[dp, mp]">);
// Batched: a rank-3 operand times a shared matrix, and two rank-3 operands.
static_assert(is<decltype(xshard::ops::matmul(t<"[dp, -, mp]">(), t<"[mp, -]">())),
                 "[dp, -, -] partial(sum: mp)">);
static_assert(is<decltype(xshard::ops::matmul(t<"[dp, -, -]">(), t<"[dp, -, mp]">())), "[dp, -, mp]">);
static_assert(is<decltype(xshard::ops::matmul(t<"[-, -, -]">(), t<"[dp, mp, -]">())),
                 "[dp, -, -] partial(sum: mp)">);
// x^T dy, the weight gradient: x [batch over dp, in] transposed contracts over dp.
static_assert(is<decltype(xshard::ops::matmul(xshard::ops::transposed(t<"[dp, -]">()), t<"[dp, mp]">())),
                 "[-, mp] partial(sum: dp)">);

// --- elementwise: dimensions aligned at the end, each takes the split of either operand ---

static_assert(is<decltype(xshard::ops::add(t<"[dp, mp]">(), t<"[dp, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::sub(t<"[dp, -]">(), t<"[-, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::maximum(t<"[dp, -]">(), t<"[-, -]">())), "[dp, -]">);
static_assert(is<decltype(xshard::ops::minimum(t<"[-, -]">(), t<"[-, mp]">())), "[-, mp]">);
// Broadcasting a bias [n] over [.., n].
static_assert(is<decltype(xshard::ops::bias_add(t<"[dp, mp]">(), t<"[mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::add(t<"[-]">(), t<"[dp, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::mul(t<"[dp, -, mp]">(), t<"[-, -]">())), "[dp, -, mp]">);
// Pending sums pass through the linear operations.
static_assert(is<decltype(xshard::ops::add(t<"[dp, -] partial(sum: mp)">(), t<"[dp, -]">())),
                 "[dp, -] partial(sum: mp)">);
static_assert(
    is<decltype(xshard::ops::add(t<"[dp, -] partial(sum: mp)">(), t<"[dp, -] partial(sum: mp)">())),
       "[dp, -] partial(sum: mp)">);
static_assert(is<decltype(xshard::ops::mul(t<"[-, -] partial(sum: mp)">(), t<"[dp, -]">())),
                 "[dp, -] partial(sum: mp)">);
static_assert(is<decltype(xshard::ops::div(t<"[dp, -] partial(sum: mp)">(), t<"[-, -]">())),
                 "[dp, -] partial(sum: mp)">);
// Unary: the layout is kept; the linear negation keeps a pending sum too.
static_assert(is<decltype(xshard::ops::relu(t<"[dp, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::gelu(t<"[(mp,dp), -]">())), "[(mp,dp), -]">);
static_assert(is<decltype(xshard::ops::exp(t<"[-, mp]">())), "[-, mp]">);
static_assert(
    is<decltype(xshard::ops::neg(t<"[dp, -] partial(sum: mp)">())), "[dp, -] partial(sum: mp)">);

// --- reductions: the dimension goes; its axes become a pending reduction -----------------

static_assert(is<decltype(xshard::ops::sum<1>(t<"[dp, mp]">())), "[dp] partial(sum: mp)">);
static_assert(is<decltype(xshard::ops::sum<0>(t<"[dp, mp]">())), "[mp] partial(sum: dp)">);
static_assert(is<decltype(xshard::ops::sum<1, true>(t<"[dp, mp]">())), "[dp, -] partial(sum: mp)">);
static_assert(is<decltype(xshard::ops::mean<1>(t<"[dp, -]">())), "[dp]">); // along a whole dimension
static_assert(is<decltype(xshard::ops::mean<0>(t<"[(dp,mp), -]">())), "[-] partial(sum: dp, mp)">);
static_assert(is<decltype(xshard::ops::max<1>(t<"[dp, mp]">())), "[dp] partial(max: mp)">);
static_assert(is<decltype(xshard::ops::min<0, true>(t<"[mp, dp]">())), "[-, dp] partial(min: mp)">);
// A pending sum summed again: both pending.
static_assert(is<decltype(xshard::ops::sum<1>(t<"[dp, mp] partial(sum: sp)", double, M3>())),
                 "[dp] partial(sum: sp, mp)", double, M3>);
// resolve carries out the pending reduction and keeps the splits.
static_assert(is<decltype(xshard::ops::resolve(t<"[dp, -] partial(sum: mp)">())), "[dp, -]">);
static_assert(is<decltype(xshard::ops::resolve(t<"[dp] partial(max: mp)">())), "[dp]">);

// --- normalisations keep the layout --------------------------------------------------------

static_assert(is<decltype(xshard::ops::softmax<1>(t<"[dp, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::log_softmax<1>(t<"[-, mp]">())), "[-, mp]">);
static_assert(is<decltype(xshard::ops::layer_norm<1>(t<"[dp, mp]">())), "[dp, mp]">);
static_assert(is<decltype(xshard::ops::batch_norm(t<"[dp, -]">())), "[dp, -]">);

// --- shape: the splits follow the dimensions ------------------------------------------------

static_assert(is<decltype(xshard::ops::transpose<1, 0>(t<"[dp, mp]">())), "[mp, dp]">);
static_assert(is<decltype(xshard::ops::transpose<2, 0, 1>(t<"[dp, -, mp]">())), "[mp, dp, -]">);
static_assert(
    is<decltype(xshard::ops::transpose<1, 0>(t<"[(dp,mp), -] partial(sum: sp)", double, M3>())),
       "[-, (dp,mp)] partial(sum: sp)", double, M3>);
static_assert(
    is<decltype(xshard::ops::reshape<"[dp, -]">(t<"[dp, -, -]">(), std::array<std::size_t, 2>{})),
       "[dp, -]">);

// --- embedding and cross-entropy ------------------------------------------------------------

using id = std::int64_t;
// Rows laid out like the ids, columns like the table's hidden dimension.
static_assert(is<decltype(xshard::ops::embedding(t<"[dp, -]", id>(), t<"[mp, -]">())), "[dp, -, -]">);
static_assert(is<decltype(xshard::ops::embedding(t<"[dp]", id>(), t<"[-, mp]">())), "[dp, mp]">);
// One loss per row, laid out like the batch (a replicated label vector is sliced).
static_assert(is<decltype(xshard::ops::cross_entropy(t<"[dp, mp]">(), t<"[dp]", id>())), "[dp]">);
static_assert(is<decltype(xshard::ops::cross_entropy(t<"[dp, mp]">(), t<"[-]", id>())), "[dp]">);

// --- the rules themselves, on run-time layout values (what shard() evaluates for them) ----

static_assert(xshard::matmul_rule(layout("[dp, mp]"), layout("[mp, -]")).out ==
              layout("[dp, -] partial(sum: mp)"));
static_assert(xshard::matmul_rule(layout("[dp, mp]"), layout("[dp, -]")).problem ==
              xshard::rule_problem::split_mismatch);
static_assert(xshard::matmul_rule(layout("[dp, -] partial(sum: mp)"),
                                  layout("[-, -] partial(sum: mp)"))
                  .problem == xshard::rule_problem::partial_product);
static_assert(xshard::unary_rule(layout("[dp, -] partial(sum: mp)"), false).problem ==
              xshard::rule_problem::nonlinear_partial);
static_assert(xshard::reduction_rule(layout("[dp, mp]"), 1, xshard::reduction::max, false).out ==
              layout("[dp] partial(max: mp)"));
static_assert(xshard::normalization_rule(layout("[dp, mp]"), 2).problem ==
              xshard::rule_problem::rank_mismatch);

} // namespace
