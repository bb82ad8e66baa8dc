#pragma once
/// \file
/// The shape of a device mesh as a value: axis names and sizes, rank <-> coordinates
/// (row-major: the last axis varies fastest), sub-groups. No communicator: the planner
/// and the cost model use this to reason about meshes far larger than the machine.

#include <xshard/compiled.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/static_vector.hpp>

#include <concepts>
#include <cstddef>
#include <limits>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xshard {

/// A size left open in a mesh: it becomes what the world size leaves for it.
inline constexpr int auto_size = 0;

/// Coordinates of a rank on a mesh, one per axis.
using mesh_coords = static_vector<int, max_mesh_axes>;

/// Axis names and sizes of a mesh.
struct mesh_shape {
    static_vector<axis_name, max_mesh_axes> names;
    static_vector<int, max_mesh_axes> sizes;

    constexpr mesh_shape() = default;

    /// A shape with the given names and sizes (all sizes >= 1).
    constexpr mesh_shape(static_vector<axis_name, max_mesh_axes> axis_names,
                         static_vector<int, max_mesh_axes> axis_sizes)
        : names(axis_names)
        , sizes(axis_sizes) {
        if (names.size() != sizes.size())
            throw std::invalid_argument("xshard: a mesh needs one size per axis");
        long long ranks = 1; // the product must fit the int of MPI's ranks
        for (std::size_t i = 0; i < names.size(); ++i) {
            if (sizes[i] < 1)
                throw std::invalid_argument("xshard: mesh axis sizes must be at least 1");
            ranks *= sizes[i];
            if (ranks > std::numeric_limits<int>::max())
                throw std::invalid_argument("xshard: a mesh of more than " +
                                            std::to_string(std::numeric_limits<int>::max()) +
                                            " ranks");
            for (std::size_t j = 0; j < i; ++j)
                if (names[i] == names[j])
                    throw std::invalid_argument("xshard: a mesh axis name appears twice");
        }
    }

    /// Fills at most one `auto_size` entry of `axis_sizes` so that the product is
    /// `world_size`. Throws std::invalid_argument, with both numbers, when it cannot.
    static constexpr mesh_shape fit(static_vector<axis_name, max_mesh_axes> axis_names,
                                    static_vector<int, max_mesh_axes> axis_sizes, int world_size) {
        long long known = 1;
        std::optional<std::size_t> open;
        for (std::size_t i = 0; i < axis_sizes.size(); ++i) {
            if (axis_sizes[i] == auto_size) {
                if (open)
                    throw std::invalid_argument(
                        "xshard: at most one mesh axis size can be left open (auto_size)");
                open = i;
            } else if (axis_sizes[i] < 1) {
                throw std::invalid_argument("xshard: mesh axis sizes must be at least 1");
            } else {
                known *= axis_sizes[i];
                if (known > std::numeric_limits<int>::max())
                    throw std::invalid_argument("xshard: a mesh of " +
                                                describe(axis_names, axis_sizes) +
                                                " has more ranks than MPI counts");
            }
        }
        if (open) {
            if (world_size % known != 0)
                throw std::invalid_argument(
                    "xshard: cannot fit a mesh of " + describe(axis_names, axis_sizes) + " to " +
                    std::to_string(world_size) + " ranks: " + std::to_string(world_size) +
                    " is not a multiple of " + std::to_string(known));
            axis_sizes[*open] = int(world_size / known);
        } else if (known != world_size) {
            throw std::invalid_argument("xshard: a mesh of " + describe(axis_names, axis_sizes) +
                                        " has " + std::to_string(known) +
                                        " ranks but the communicator has " +
                                        std::to_string(world_size));
        }
        return mesh_shape(axis_names, axis_sizes);
    }

    /// Parses "dp=2,mp=4" (spaces allowed around names, sizes and commas).
    static constexpr mesh_shape parse(std::string_view text) {
        static_vector<axis_name, max_mesh_axes> axis_names;
        static_vector<int, max_mesh_axes> axis_sizes;
        auto trim = [](std::string_view s) {
            while (!s.empty() && s.front() == ' ')
                s.remove_prefix(1);
            while (!s.empty() && s.back() == ' ')
                s.remove_suffix(1);
            return s;
        };
        while (!text.empty()) {
            const auto comma = text.find(',');
            const auto item = text.substr(0, comma);
            text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
            const auto eq = item.find('=');
            if (eq == std::string_view::npos)
                throw std::invalid_argument("xshard: a mesh is written name=size,name=size");
            const auto name = trim(item.substr(0, eq));
            const auto digits = trim(item.substr(eq + 1));
            if (!is_valid_axis_name(name))
                throw std::invalid_argument("xshard: bad mesh axis name '" + std::string(name) +
                                            "'");
            int size = 0;
            for (char c : digits) {
                if (c < '0' || c > '9' || size > (std::numeric_limits<int>::max() - (c - '0')) / 10)
                    throw std::invalid_argument("xshard: bad size of mesh axis '" +
                                                std::string(name) + "'");
                size = size * 10 + (c - '0');
            }
            if (digits.empty() || axis_names.size() == max_mesh_axes)
                throw std::invalid_argument("xshard: bad mesh '" + std::string(name) + "'");
            axis_names.push_back(axis_name(name));
            axis_sizes.push_back(size);
        }
        return mesh_shape(axis_names, axis_sizes);
    }

    constexpr std::size_t ndim() const { return names.size(); }

    /// The number of ranks (product of the sizes).
    constexpr int size() const {
        int n = 1;
        for (int s : sizes)
            n *= s;
        return n;
    }

    /// The index of the axis called `name`, if any.
    constexpr std::optional<std::size_t> find(std::string_view name) const {
        for (std::size_t i = 0; i < names.size(); ++i)
            if (names[i].view() == name)
                return i;
        return std::nullopt;
    }

    /// The index of the axis called `name`; throws std::invalid_argument if there is none.
    constexpr std::size_t index(std::string_view name) const {
        if (auto i = find(name))
            return *i;
        throw std::invalid_argument("xshard: the mesh " + to_string() + " has no axis '" +
                                    std::string(name) + "'");
    }

    /// `index` of an axis name held as one: the whole names compare, without measuring them.
    template <std::same_as<axis_name> A>
    constexpr std::size_t index(const A& name) const {
        for (std::size_t i = 0; i < names.size(); ++i)
            if (names[i] == name)
                return i;
        return index(name.view());
    }

    /// The size of the axis called `name`.
    constexpr int axis_size(std::string_view name) const { return sizes[index(name)]; }

    /// All axes.
    constexpr axis_set all_axes() const { return axis_set::first(ndim()); }

    /// The number of ranks in a group spanned by `axes`.
    constexpr int group_size(axis_set axes) const {
        int n = 1;
        for (std::size_t i = 0; i < ndim(); ++i)
            if (axes.contains(i))
                n *= sizes[i];
        return n;
    }

    /// The coordinates of `rank`.
    constexpr mesh_coords coords(int rank) const {
        mesh_coords c;
        c.count = ndim();
        for (std::size_t i = ndim(); i-- > 0;) {
            c[i] = rank % sizes[i];
            rank /= sizes[i];
        }
        return c;
    }

    /// The rank at `coords`.
    constexpr int rank_of(const mesh_coords& c) const {
        int rank = 0;
        for (std::size_t i = 0; i < ndim(); ++i)
            rank = rank * sizes[i] + c[i];
        return rank;
    }

    /// The rank of `rank` inside its group spanned by `axes`: its coordinates on those
    /// axes, row-major (the order of MPI_Cart_sub).
    constexpr int group_rank(int rank, axis_set axes) const {
        const auto c = coords(rank);
        int r = 0;
        for (std::size_t i = 0; i < ndim(); ++i)
            if (axes.contains(i))
                r = r * sizes[i] + c[i];
        return r;
    }

    /// Which group spanned by `axes` holds `rank`: its coordinates on the other axes,
    /// row-major. Ranks with equal colours form one group.
    constexpr int group_color(int rank, axis_set axes) const {
        return group_rank(rank, all_axes() - axes);
    }

    /// The ranks of the group spanned by `axes` that holds `rank`, in group-rank order.
    std::vector<int> group_ranks(int rank, axis_set axes) const;

    /// "dp=2, mp=4".
    std::string to_string() const { return describe(names, sizes); }

    friend std::ostream& operator<<(std::ostream& os, const mesh_shape& m) {
        return os << "mesh(" << m.to_string() << ")";
    }

    friend constexpr bool operator==(const mesh_shape&, const mesh_shape&) = default;

private:
    static std::string describe(const static_vector<axis_name, max_mesh_axes>& axis_names,
                                const static_vector<int, max_mesh_axes>& axis_sizes);
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/mesh_shape.ipp>
#endif
