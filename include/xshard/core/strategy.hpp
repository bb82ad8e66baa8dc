#pragma once
/// \file
/// MindSpore strategies: split counts per tensor dimension, e.g. (2, 4), resolved against
/// a mesh into layouts.
///
/// The rule is xshard's own reading of MindSpore's device matrix. With p ranks and counts
/// (s0, ..., s(r-1)) whose product q divides p, the ranks form the row-major device matrix
/// [p / q, s0, ..., s(r-1)]: the leading p / q is *repeated computation* (those ranks hold
/// the same blocks). On a mesh, whose ranks are row-major too, each count must therefore be
/// the product of a run of consecutive mesh axes, matched from the last axis backwards:
/// the last dimension takes the trailing axes whose sizes multiply to its count, the
/// dimension before it the axes before those, and so on; a count of 1 takes none; the
/// leading axes left over are replicated. On mesh(dp=2, mp=4):
///
///     (2, 4) -> [dp, mp]      (8, 1) -> [(dp,mp), -]      (4, 1) -> [mp, -]   (dp repeats)
///     (1, 2) -> error: count 2 of dimension 1 fits no run of axes ending at mp (size 4)
///
/// Where it differs from MindSpore: MindSpore's operators put the repeated-computation
/// dimension *last* by default ([s0, ..., s(r-1), p / q]: ranks r and r + 1 repeat each
/// other), xshard puts it on the leading mesh axes (ranks r and r + q repeat each other).
/// The blocks, their values and the number of ranks holding each are the same either way;
/// only which rank holds which block differs, and nothing changes without repetition
/// (q = p). Leading axes are the data-parallel ones (dp before mp), so the repeated ranks are
/// the groups gradients are summed over, and every count is a run of whole mesh axes. A
/// count that fits no run of trailing axes is an error even where MindSpore's placement would
/// use leading ones ((2, 1) on mesh(dp=2, mp=4)): write that layout, [dp, -], instead.
///
/// Axes of size 1 are never used. Operators have their own device matrix: for MatMul
/// ((a, b), (b, c)) it is [a, b, c] (`resolve_matmul`), so that both operands split the
/// contraction dimension over the same axes.

#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/static_vector.hpp>

#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <stdexcept>
#include <string>

namespace xshard {

/// Split counts per tensor dimension.
struct strategy {
    static_vector<int, max_tensor_rank> counts;

    constexpr strategy() = default;
    constexpr strategy(std::initializer_list<int> c)
        : counts(c) {}

    constexpr std::size_t rank() const { return counts.size(); }

    /// The number of ranks that hold distinct blocks (the product of the counts).
    constexpr int blocks() const {
        int n = 1;
        for (int c : counts)
            n *= c;
        return n;
    }

    /// "(2, 4)".
    constexpr std::string to_string() const {
        std::string s = "(";
        for (std::size_t i = 0; i < counts.size(); ++i) {
            if (i)
                s += ", ";
            std::string digits;
            for (int c = counts[i] < 0 ? -counts[i] : counts[i]; digits.empty() || c > 0; c /= 10)
                digits.insert(digits.begin(), char('0' + c % 10));
            s += (counts[i] < 0 ? "-" : "") + digits;
        }
        return s + (counts.size() == 1 ? ",)" : ")");
    }

    friend std::ostream& operator<<(std::ostream& os, const strategy& s) {
        return os << s.to_string();
    }
    friend constexpr bool operator==(const strategy&, const strategy&) = default;
};

/// The mesh axes of each dimension of a device matrix [p / q, c0, ..., c(n-1)] on `mesh`
/// (q = the product of the counts): count i takes a run of consecutive mesh axes, matched
/// from the last mesh axis backwards; the leading axes left over repeat. Throws
/// std::invalid_argument naming the count that fits no axis; `what` names the strategy in
/// the message.
constexpr static_vector<dim_axes, max_tensor_rank + 2>
resolve_device_matrix(const static_vector<int, max_tensor_rank + 2>& counts, const mesh_shape& mesh,
                      const std::string& what) {
    int product = 1;
    for (int c : counts) {
        if (c < 1)
            throw std::invalid_argument("xshard: " + what + ": split counts must be at least 1");
        product *= c;
    }
    if (mesh.size() % product != 0)
        throw std::invalid_argument("xshard: " + what + " needs " + std::to_string(product) +
                                    " blocks, which do not divide the " +
                                    std::to_string(mesh.size()) + " ranks of mesh(" +
                                    mesh.to_string() + ")");
    static_vector<dim_axes, max_tensor_rank + 2> groups;
    groups.count = counts.size();
    std::size_t next = mesh.ndim(); // mesh axes [next, ndim) are taken
    for (std::size_t d = counts.size(); d-- > 0;) {
        dim_axes axes; // collected minor to major, reversed below
        int got = 1;
        while (got < counts[d] && next > 0) {
            --next;
            if (mesh.sizes[next] == 1)
                continue;
            got *= mesh.sizes[next];
            axes.push_back(mesh.names[next]);
        }
        if (got != counts[d])
            throw std::invalid_argument(
                "xshard: " + what + ": count " + std::to_string(counts[d]) + " of dimension " +
                std::to_string(d) +
                " fits no run of mesh axes (matched from the last axis of mesh(" +
                mesh.to_string() + ") backwards)");
        for (std::size_t i = axes.size(); i-- > 0;)
            groups[d].push_back(axes[i]);
    }
    return groups;
}

/// The layout of strategy `s` on `mesh` (xshard's device-matrix rule, see the file comment).
/// Throws
/// std::invalid_argument naming the count that fits no axis.
constexpr layout resolve(const strategy& s, const mesh_shape& mesh) {
    static_vector<int, max_tensor_rank + 2> counts;
    for (int c : s.counts)
        counts.push_back(c);
    const auto groups = resolve_device_matrix(counts, mesh, "strategy " + s.to_string());
    layout l = layout::replicated(s.rank());
    for (std::size_t d = 0; d < s.rank(); ++d)
        l.dims[d] = groups[d];
    return l;
}

/// The layouts of a MindSpore MatMul strategy ((a, b), (b, c)) on `mesh`: the device matrix
/// [a, b, c] (with repetition in front), x = [A, B] and w = [B, C]; batched
/// ((n.., a, b), (n.., b, c)) adds the batch counts in front. The contraction count must
/// agree. The product, laid out [A, C] partial(sum: B), follows from the matmul rule.
struct matmul_layouts {
    layout x;
    layout w;
};

constexpr matmul_layouts resolve_matmul(const strategy& x, const strategy& w,
                                        const mesh_shape& mesh) {
    const std::string what = "MatMul strategy (" + x.to_string() + ", " + w.to_string() + ")";
    if (x.rank() < 2 || w.rank() != x.rank() || x.counts[x.rank() - 1] != w.counts[w.rank() - 2])
        throw std::invalid_argument("xshard: " + what +
                                    ": the strategies must be ((.., a, b), "
                                    "(.., b, c)) with the same contraction count b");
    for (std::size_t d = 0; d + 2 < x.rank(); ++d)
        if (x.counts[d] != w.counts[d])
            throw std::invalid_argument("xshard: " + what + ": the batch counts must agree");
    static_vector<int, max_tensor_rank + 2> counts; // [batch.., a, b, c]
    for (std::size_t d = 0; d < x.rank(); ++d)
        counts.push_back(x.counts[d]);
    counts.push_back(w.counts[w.rank() - 1]);
    const auto g = resolve_device_matrix(counts, mesh, what);
    const std::size_t r = x.rank();
    matmul_layouts out{layout::replicated(r), layout::replicated(r)};
    for (std::size_t d = 0; d + 2 < r; ++d)
        out.x.dims[d] = out.w.dims[d] = g[d];
    out.x.dims[r - 2] = g[r - 2];
    out.x.dims[r - 1] = out.w.dims[r - 2] = g[r - 1];
    out.w.dims[r - 1] = g[r];
    return out;
}

} // namespace xshard
