#pragma once
/// \file
/// Layouts: how a tensor is laid out over the axes of a mesh.
///
/// For each tensor dimension a layout lists the mesh axes it is split over, major to
/// minor, or none. A mesh axis that no dimension uses is *replicated* (every rank along
/// it holds the same values) unless the layout marks it *partial*: each rank along it
/// holds a term, and the true value is the reduction (sum, max or min) of the terms.
/// This is MindSpore's tensor_map, JAX's PartitionSpec, plus DTensor's Partial.
///
/// Notation (the printer writes it, `layout::parse` and the string constructor read it):
///
///     [(dp,mp), -]                 dim 0 over dp then mp (dp major), dim 1 not split
///     [dp, mp]                     dim 0 over dp, dim 1 over mp
///     [-, mp] partial(sum: dp)     dim 1 over mp, a pending sum over dp
///     [-, -]                       fully replicated; [] is a scalar
///
/// Spaces are free; the reduction is `sum`, `max` or `min`, one per layout. A layout is a
/// structural literal type: `dtensor<double, M, "[dp, mp]">` takes it as a template
/// argument, a strategy file or the command line gives it at run time, and the same
/// constexpr functions answer both.

#include <xshard/compiled.hpp>
#include <xshard/comm/reduction.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/static_vector.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace xshard {

/// Highest tensor rank a layout describes.
inline constexpr std::size_t max_tensor_rank = 8;

/// The mesh axes a tensor dimension is split over, major to minor.
using dim_axes = static_vector<axis_name, max_mesh_axes>;

/// What makes a layout unusable on a mesh (see `layout::check`).
enum class layout_problem : std::uint8_t {
    none,
    axis_used_twice, ///< an axis splits two dimensions, or splits one and is partial
    unknown_axis,    ///< an axis the mesh does not have
};

struct layout {
    static_vector<dim_axes, max_tensor_rank> dims;
    dim_axes partial;
    reduction op = reduction::sum;
    /// Marks the template argument of a tensor whose layout is chosen at run time (see
    /// `dynamic_layout`); false for every real layout.
    bool dynamic = false;

    constexpr layout() = default;

    /// Parses the notation; implicit so that a string literal can be a layout template
    /// argument. Throws std::invalid_argument on malformed text (a compile error when
    /// evaluated at compile time).
    constexpr layout(const char* notation)
        : layout(parse(notation)) {}

    /// The fully replicated layout of a tensor of rank `rank`.
    static constexpr layout replicated(std::size_t rank) {
        layout l;
        for (std::size_t d = 0; d < rank; ++d)
            l.dims.push_back({});
        return l;
    }

    static constexpr layout parse(std::string_view text);

    /// The rank of the tensor the layout describes.
    constexpr std::size_t rank() const { return dims.size(); }

    /// The mesh axes dimension `d` is split over, major to minor.
    constexpr const dim_axes& axes(std::size_t d) const { return dims[d]; }

    /// Whether dimension `d` is split at all.
    constexpr bool is_split(std::size_t d) const { return !dims[d].empty(); }

    /// Whether some mesh axis holds pending terms.
    constexpr bool is_partial() const { return !partial.empty(); }

    /// Nothing split and nothing partial: every rank holds the whole tensor.
    constexpr bool is_fully_replicated() const {
        for (const auto& d : dims)
            if (!d.empty())
                return false;
        return !is_partial();
    }

    /// The dimension split over `axis`, if any.
    constexpr std::optional<std::size_t> dim_of(const axis_name& axis) const {
        for (std::size_t d = 0; d < dims.size(); ++d)
            if (dims[d].contains(axis))
                return d;
        return std::nullopt;
    }

    /// Whether `axis` is named anywhere (splitting a dimension or partial).
    constexpr bool uses(const axis_name& axis) const {
        return dim_of(axis).has_value() || partial.contains(axis);
    }

    /// The first problem that makes this layout unusable on a mesh with axes `mesh_axes`.
    template <class Names>
    constexpr layout_problem check(const Names& mesh_axes) const {
        dim_axes seen;
        auto visit = [&](const axis_name& a) {
            bool known = false;
            for (const auto& m : mesh_axes)
                known = known || m == a;
            if (!known)
                return layout_problem::unknown_axis;
            if (seen.contains(a))
                return layout_problem::axis_used_twice;
            seen.push_back(a);
            return layout_problem::none;
        };
        for (const auto& d : dims)
            for (const auto& a : d)
                if (auto p = visit(a); p != layout_problem::none)
                    return p;
        for (const auto& a : partial)
            if (auto p = visit(a); p != layout_problem::none)
                return p;
        return layout_problem::none;
    }

    /// Throws std::invalid_argument naming the problem if the layout does not fit `mesh`.
    void validate(const mesh_shape& mesh) const;

    // Queries on a mesh (the layout must fit it).

    /// The set of mesh axes splitting dimension `d`.
    constexpr axis_set split_axes(std::size_t d, const mesh_shape& mesh) const {
        axis_set s;
        for (const auto& a : dims[d])
            s = s.with(mesh.index(a));
        return s;
    }

    /// The set of mesh axes splitting any dimension.
    constexpr axis_set split_axes(const mesh_shape& mesh) const {
        axis_set s;
        for (std::size_t d = 0; d < rank(); ++d)
            s = s | split_axes(d, mesh);
        return s;
    }

    /// The set of partial mesh axes.
    constexpr axis_set partial_axes(const mesh_shape& mesh) const {
        axis_set s;
        for (const auto& a : partial)
            s = s.with(mesh.index(a));
        return s;
    }

    /// The mesh axes along which every rank holds the same values.
    constexpr axis_set replicated_axes(const mesh_shape& mesh) const {
        return mesh.all_axes() - split_axes(mesh) - partial_axes(mesh);
    }

    /// Into how many blocks dimension `d` is split on `mesh`.
    constexpr int split_count(std::size_t d, const mesh_shape& mesh) const {
        return mesh.group_size(split_axes(d, mesh));
    }

    /// Which of those blocks the rank at coordinates `c` holds: its coordinates on the
    /// splitting axes, row-major in the layout's order (the first axis major).
    constexpr int block_index(std::size_t d, const mesh_shape& mesh, const mesh_coords& c) const {
        int b = 0;
        for (const auto& a : dims[d]) {
            const auto i = mesh.index(a);
            b = b * mesh.sizes[i] + c[i];
        }
        return b;
    }

    /// The notation, e.g. "[(dp,mp), -] partial(sum: sp)".
    std::string to_string() const;

    friend std::ostream& operator<<(std::ostream& os, const layout& l) {
        return os << l.to_string();
    }

    /// Equal layouts: the same splits, the same partial axes (in any order) with the same
    /// reduction.
    friend constexpr bool operator==(const layout& a, const layout& b) {
        if (a.dynamic != b.dynamic || !(a.dims == b.dims) || a.partial.size() != b.partial.size())
            return false;
        for (const auto& x : a.partial)
            if (!b.partial.contains(x))
                return false;
        return a.partial.empty() || a.op == b.op;
    }
};

/// The template argument of a distributed tensor of rank `rank` whose layout is a run-time
/// value (read from a strategy file, resolved from a strategy on a mesh whose sizes are
/// known only at run time): `dtensor<double, M, dynamic_layout(2)>`.
constexpr layout dynamic_layout(std::size_t rank) {
    layout l = layout::replicated(rank);
    l.dynamic = true;
    return l;
}

/// The layout of the gradient of a tensor laid out as `l` on `mesh`: its replicated axes
/// become pending sums and its pending sums become replicated, the splits stay. This is the
/// adjoint under the inner product of the ranks' local data summed over the ranks: a
/// redistribution from `from` to `to` has the redistribution from dual(to) to dual(from) as
/// its adjoint (all-gather <-> reduce-scatter, slice <-> zero-fill, all-reduce <-> all-reduce,
/// all-to-all <-> all-to-all). Gradients laid out so need no collective where each rank's term
/// is its own contribution (Megatron's copy region) and complete themselves, as sums over the
/// replicas, where the forward pass reduced. Max and min are not linear: a partial(max) or
/// partial(min) layout has no dual.
constexpr layout dual(const layout& l, const mesh_shape& mesh) {
    if (l.is_partial() && l.op != reduction::sum)
        throw std::invalid_argument("xshard: a partial(" + std::string(to_string(l.op)) +
                                    ") layout has no adjoint: " + std::string(to_string(l.op)) +
                                    " is not linear");
    layout d = l;
    d.partial.clear();
    d.op = reduction::sum;
    for (const auto& a : mesh.names)
        if (!l.uses(a))
            d.partial.push_back(a);
    return d;
}

namespace detail {

/// A small recursive-descent reader of the layout notation.
struct layout_reader {
    std::string_view text;
    std::size_t pos = 0;

    // Every error is a throw at its own line: evaluated at compile time, the compiler
    // shows that line, message included.
    constexpr void skip() {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t'))
            ++pos;
    }
    constexpr bool take(char c) {
        skip();
        if (pos < text.size() && text[pos] == c) {
            ++pos;
            return true;
        }
        return false;
    }
    constexpr std::string_view word() {
        skip();
        const auto start = pos;
        while (pos < text.size() &&
               (text[pos] == '_' || (text[pos] >= 'a' && text[pos] <= 'z') ||
                (text[pos] >= 'A' && text[pos] <= 'Z') || (text[pos] >= '0' && text[pos] <= '9')))
            ++pos;
        return text.substr(start, pos - start);
    }
    constexpr axis_name axis() {
        const auto w = word();
        if (!is_valid_axis_name(w))
            throw std::invalid_argument(
                "xshard: layout notation: expected a mesh axis name (letters, digits, _)");
        return axis_name(w);
    }
    constexpr dim_axes axis_list(char close) {
        dim_axes axes;
        do {
            if (axes.size() == max_mesh_axes)
                throw std::invalid_argument(
                    "xshard: layout notation: more axes than a mesh can have");
            axes.push_back(axis());
        } while (take(','));
        if (!take(close))
            throw std::invalid_argument(
                "xshard: layout notation: expected ',' or the end of an axis list");
        return axes;
    }
    constexpr dim_axes dim() {
        if (take('-'))
            return {};
        if (take('('))
            return axis_list(')');
        dim_axes one;
        one.push_back(axis());
        return one;
    }
    constexpr layout read() {
        layout l;
        if (!take('['))
            throw std::invalid_argument("xshard: layout notation: a layout starts with '['");
        if (!take(']')) {
            do {
                if (l.dims.size() == max_tensor_rank)
                    throw std::invalid_argument("xshard: layout notation: more than 8 dimensions");
                l.dims.push_back(dim());
            } while (take(','));
            if (!take(']'))
                throw std::invalid_argument(
                    "xshard: layout notation: expected ',' or ']' after a dimension");
        }
        skip();
        if (pos < text.size()) {
            if (word() != "partial")
                throw std::invalid_argument(
                    "xshard: layout notation: only 'partial(op: axes)' may follow ']'");
            if (!take('('))
                throw std::invalid_argument(
                    "xshard: layout notation: expected '(' after 'partial'");
            const auto op = word();
            if (op == "sum")
                l.op = reduction::sum;
            else if (op == "max")
                l.op = reduction::max;
            else if (op == "min")
                l.op = reduction::min;
            else
                throw std::invalid_argument(
                    "xshard: layout notation: the reduction of partial() is sum, max or min");
            if (!take(':'))
                throw std::invalid_argument(
                    "xshard: layout notation: expected ':' after the reduction");
            l.partial = axis_list(')');
        }
        skip();
        if (pos != text.size())
            throw std::invalid_argument(
                "xshard: layout notation: unexpected text after the layout");
        return l;
    }
};

} // namespace detail

constexpr layout layout::parse(std::string_view text) {
    return detail::layout_reader{text}.read();
}

} // namespace xshard

namespace std {

/// Hashes layouts consistently with `==`: the partial axes in any order, the reduction only
/// where some axis is partial.
template <>
struct hash<xshard::layout> {
    std::size_t operator()(const xshard::layout& l) const noexcept;
};

} // namespace std

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/layout.ipp>
#endif
