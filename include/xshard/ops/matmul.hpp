#pragma once
/// \file
/// Matrix products of distributed tensors, local GEMM through BLAS.
///
/// Rule (rules.hpp, `matmul_rule`): a [batch.., i, k] @ b [batch.., k, j] (or b [k, j]):
/// the contraction and batch dimensions must be split alike (a replicated operand is sliced
/// to the other, no messages); the product is [batch.., I, J] partial(sum: K): with a split
/// contraction each rank holds a term, and the consumer resolves it (`resolve` all-reduces,
/// a redistribution to a split layout reduce-scatters). Layouts that do not fit are a
/// compile error for layout types unless the mesh type inserts redistributions.
///
/// MindSpore's MatMul strategies ((a, b), (b, c)) resolve on a mesh with the device matrix
/// [a, b, c] (`resolve_matmul` in core/strategy.hpp): shard the operands with those layouts.
///
/// `transposed(a)` is an operand with a's last two dimensions swapped, read by BLAS as stored
/// (no copy): `matmul(transposed(x), dy)` is x^T dy. `matmul(a, b, out, {.accumulate = true})`
/// adds the product to `out` (no temporary), as gradients are summed.

#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>

#include <xtensor-blas/xblas.hpp>
#include <xtensor/xtensor.hpp>

#include <complex>
#include <type_traits>

namespace xshard {

namespace detail {

struct matmul_rule_fn {
    constexpr rule_result operator()(const layout& a, const layout& b) const {
        return matmul_rule(a, b);
    }
};

template <class T>
constexpr bool blas_type =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

/// C (m x n, row-major, leading dimension ldc) = A (m x k) B (k x n), plus C if `add`, by
/// BLAS; A and B are stored transposed (k x m, n x k) where `ta`, `tb` say so.
template <class T>
void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
          std::size_t lda, const T* b, std::size_t ldb, bool add, T* c, std::size_t ldc) {
    if (m == 0 || n == 0)
        return;
    if (k == 0) {
        if (!add)
            std::fill_n(c, m * ldc, T{});
        return;
    }
    using index = xt::blas_index_t;
    auto op = [](bool t) {
        return t ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans;
    };
    cxxblas::gemm<index>(cxxblas::StorageOrder::RowMajor, op(ta), op(tb), index(m), index(n),
                         index(k), T(1), a, index(lda), b, index(ldb), T(add ? 1 : 0), c,
                         index(ldc));
}

/// The layout with its last two dimensions swapped.
constexpr layout swap_last_two(layout l) {
    const std::size_t r = l.rank();
    if (r >= 2)
        std::swap(l.dims[r - 2], l.dims[r - 1]);
    return l;
}

} // namespace detail

namespace ops {

/// A matmul operand: tensor `of` with its last two dimensions swapped, not copied (see
/// `transposed`). It has the layout and shape of the transpose.
template <distributed_tensor A>
struct transposed_operand {
    using value_type = typename A::value_type;
    using mesh_type = typename A::mesh_type;
    static constexpr std::size_t rank = A::rank;
    static constexpr xshard::layout static_layout = detail::swap_last_two(A::static_layout);
    static_assert(rank >= 2, "xshard: transposed: the tensor needs two dimensions to swap");

    const A& of;

    xshard::layout layout() const { return detail::swap_last_two(of.layout()); }
    const mesh_type& mesh() const noexcept { return of.mesh(); }
    std::array<std::size_t, rank> shape() const {
        auto s = of.shape();
        std::swap(s[rank - 2], s[rank - 1]);
        return s;
    }
};

/// `a` with its last two dimensions swapped, as an operand of matmul (BLAS reads a as stored).
/// It refers to `a`: pass it straight to matmul rather than keeping it beyond `a`'s life.
template <distributed_tensor A>
transposed_operand<A> transposed(const A& a) {
    return {a};
}

} // namespace ops

namespace detail {
template <class A>
constexpr bool is_transposed = false;
template <class A>
constexpr bool is_transposed<ops::transposed_operand<A>> = true;

/// The tensor an operand reads.
template <class A>
const auto& tensor_of(const A& a) {
    if constexpr (is_transposed<A>)
        return a.of;
    else
        return a;
}
} // namespace detail

namespace ops {

/// What matmul multiplies: a distributed tensor or a transposed one.
template <class A>
concept matmul_operand = distributed_tensor<A> || detail::is_transposed<A>;

/// Options of matmul(a, b, out, options).
struct matmul_options {
    /// out += a b instead of out = a b.
    bool accumulate = false;
};

/// The matrix product (batched for rank > 2), with the sharding rule above. Local products
/// are BLAS gemm calls (one per batch element); no messages unless the mesh type inserts
/// redistributions and the operands need one. `matmul(a, b, out)` writes into an existing
/// result (of the type and shape `matmul(a, b)` returns) without allocating.
struct matmul_fn : shardable<matmul_fn> {
    static constexpr std::string_view name = "matmul";

    /// On traced tensors: records the product in the program being traced.
    template <traced_operand A, traced_operand B>
    auto operator()(const A& a, const B& b) const {
        return trace_call(name, op_attributes{}, op_annotation{}, a, b);
    }

    template <matmul_operand A, matmul_operand B>
    auto operator()(const A& a, const B& b) const {
        using rule = detail::rule_for<detail::matmul_rule_fn, A, B>;
        constexpr std::size_t ra = A::rank, rb = B::rank;
        check(a, b);
        const auto& r = rule::get("matmul", a, b);
        std::array<std::size_t, ra> shape = a.shape();
        shape[ra - 1] = b.shape()[rb - 1];
        const auto out_block = block_of(r.out, a.mesh().shape(), shape, a.mesh().rank());
        using result = detail::result_t<typename A::value_type, typename A::mesh_type,
                                        rule::is_static, rule::value.out, ra>;
        result out(detail::unchecked, a.mesh(), shape,
                   xt::xtensor<typename A::value_type, ra>::from_shape(out_block.extent), r.out);
        compute(a, b, r, out, false);
        return out;
    }

    template <matmul_operand A, matmul_operand B, distributed_tensor C>
    void operator()(const A& a, const B& b, C& out, matmul_options o = {}) const {
        using rule = detail::rule_for<detail::matmul_rule_fn, A, B>;
        check(a, b);
        const auto& r = rule::get("matmul", a, b);
        auto shape = a.shape();
        shape[A::rank - 1] = b.shape()[B::rank - 1];
        if (!(out.mesh() == a.mesh()) || out.shape() != shape || !(out.layout() == r.out) ||
            detail::to_array<C::rank>(out.local().shape()) != out.block().extent)
            throw error("xshard: matmul: the output tensor is not the product's (mesh, shape " +
                        detail::shape_string(shape) + ", layout " + r.out.to_string() + ")");
        compute(a, b, r, out, o.accumulate);
    }

private:
    template <class A, class B>
    static void check(const A& a, const B& b) {
        using T = typename A::value_type;
        static_assert(std::is_same_v<T, typename B::value_type>,
                      "xshard: matmul: the operands must have the same element type");
        static_assert(detail::blas_type<T>,
                      "xshard: matmul: the element type must be float, double or complex (BLAS)");
        static_assert(std::is_same_v<typename A::mesh_type, typename B::mesh_type>,
                      "xshard: matmul: the operands live on meshes of different types");
        constexpr std::size_t ra = A::rank, rb = B::rank;
        static_assert(ra >= 2 && (rb == 2 || rb == ra),
                      "xshard: matmul: a is [batch.., i, k] and b is [batch.., k, j] or [k, j]");
        const auto& sa = a.shape();
        const auto& sb = b.shape();
        bool fits = sa[ra - 1] == sb[rb - 2];
        for (std::size_t d = 0; d + 2 < ra && rb == ra; ++d)
            fits = fits && sa[d] == sb[d];
        if (!fits || !(a.mesh() == b.mesh()))
            throw error("xshard: matmul: shapes " + detail::shape_string(sa) + " and " +
                        detail::shape_string(sb) + " do not multiply (or the meshes differ)");
    }

    template <class A, class B, class C>
    static void compute(const A& a, const B& b, const rule_result& r, C& out, bool add) {
        using rule = detail::rule_for<detail::matmul_rule_fn, A, B>;
        constexpr std::size_t ra = A::rank, rb = B::rank;
        constexpr bool ta = detail::is_transposed<A>, tb = detail::is_transposed<B>;
        // A transposed operand is prepared as stored, in the transpose of the rule's layout.
        const auto pa = detail::prepare(detail::tensor_of(a), ta ? detail::swap_last_two(r.a) : r.a,
                                        rule::may_redistribute, "matmul");
        const auto pb = detail::prepare(detail::tensor_of(b), tb ? detail::swap_last_two(r.b) : r.b,
                                        rule::may_redistribute, "matmul");
        const auto& la = pa.get();
        const auto& lb = pb.get();
        auto& local = out.local();
        const std::size_t m = la.shape()[ra - (ta ? 1 : 2)], k = la.shape()[ra - (ta ? 2 : 1)],
                          n = lb.shape()[rb - (tb ? 2 : 1)];
        const std::size_t batches = m > 0 && n > 0 ? local.size() / (m * n) : 0;
        for (std::size_t i = 0; i < batches; ++i)
            detail::gemm(ta, tb, m, n, k, la.data() + i * m * k, ta ? m : k,
                         lb.data() + (rb == ra ? i * k * n : 0), tb ? k : n, add,
                         local.data() + i * m * n, n);
    }
};

/// a @ b, distributed (see matmul_fn).
inline constexpr matmul_fn matmul{};

} // namespace ops

} // namespace xshard
