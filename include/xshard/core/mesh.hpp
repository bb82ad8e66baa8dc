#pragma once
/// \file
/// The device mesh: an N-dimensional grid of MPI ranks with named axes.

#include <xshard/comm/communicator.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/mesh_shape.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xshard {

/// How shard() lays out inputs and outputs that have no strategy of their own (MindSpore's
/// dataset_strategy). `unset`: inputs held whole by every rank are replicated, outputs keep
/// the layout the computation gives them. `full_batch`: inputs and outputs are not split.
/// `data_parallel`: their first (batch) dimension is split over the data-parallel axis.
enum class dataset_strategy { unset, full_batch, data_parallel };

namespace detail {
template <fixed_string... Names>
constexpr bool names_distinct() {
    constexpr std::array<std::string_view, sizeof...(Names)> names{Names.view()...};
    for (std::size_t i = 0; i < names.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            if (names[i] == names[j])
                return false;
    return true;
}
} // namespace detail

/// A mesh of the ranks of a communicator with compile-time axis names and run-time sizes.
/// Ranks are laid out row-major (the last axis varies fastest, like MindSpore's device
/// matrix): on `mesh<"dp", "mp">` of sizes {2, 4}, rank 5 is at dp=1, mp=1.
///
/// The mesh duplicates the communicator it is given (xshard's messages never mix with the
/// application's) and creates the sub-communicator of every subset of its axes once, at
/// construction (collective over the communicator; 2^ndim communicators). Copies share
/// them. Construction throws `xshard::error` on every rank when the sizes do not fit the
/// communicator.
template <fixed_string... Names>
class mesh {
    static_assert(sizeof...(Names) >= 1, "xshard: a mesh needs at least one axis");
    static_assert(sizeof...(Names) <= max_mesh_axes, "xshard: a mesh has at most 6 axes");
    static_assert((is_valid_axis_name(Names.view()) && ...),
                  "xshard: mesh axis names are 1 to 15 letters, digits or underscores, not "
                  "starting with a digit");
    static_assert(detail::names_distinct<Names...>(),
                  "xshard: a mesh axis name appears twice in the mesh");

public:
    /// The number of axes.
    static constexpr std::size_t ndim = sizeof...(Names);
    /// The axis names, in order.
    static constexpr std::array<axis_name, ndim> axis_names{axis_name(Names.view())...};

    /// Whether the mesh type has an axis called `name`.
    static constexpr bool has_axis(std::string_view name) {
        for (const auto& a : axis_names)
            if (a.view() == name)
                return true;
        return false;
    }

    /// The index of axis `Name` (a compile error if the mesh has no such axis).
    template <fixed_string Name>
    static constexpr std::size_t axis_index() {
        static_assert(has_axis(Name.view()), "xshard: the mesh has no axis of this name");
        std::size_t i = 0;
        while (axis_names[i].view() != Name.view())
            ++i;
        return i;
    }

    /// The set of axes `A...` (compile errors for unknown names).
    template <fixed_string... A>
    static constexpr axis_set axes() {
        return (axis_set{} | ... | axis_set::of(axis_index<A>()));
    }

    /// A mesh over MPI_COMM_WORLD; one size may be `auto_size`.
    explicit mesh(const std::array<int, ndim>& sizes)
        : mesh(communicator::world(), sizes) {}

    /// A mesh over `comm`; one size may be `auto_size` (then it is comm.size() divided by
    /// the others).
    mesh(const communicator& comm, const std::array<int, ndim>& sizes)
        : state_(std::make_shared<state>(make_shape(comm, sizes), comm)) {}

    /// The mesh's shape (names and sizes).
    const mesh_shape& shape() const noexcept { return state_->shape; }
    /// The communicator of the whole mesh (a duplicate of the one given).
    const communicator& comm() const noexcept { return state_->subs.back(); }
    /// This rank's rank in the mesh.
    int rank() const noexcept { return comm().rank(); }
    /// The number of ranks.
    int size() const noexcept { return comm().size(); }
    /// The size of axis `i`.
    int axis_size(std::size_t i) const { return shape().sizes[i]; }
    /// The size of axis `Name`.
    template <fixed_string Name>
    int axis_size() const {
        return shape().sizes[axis_index<Name>()];
    }
    /// This rank's coordinates.
    mesh_coords coords() const { return shape().coords(rank()); }
    /// The coordinates of `rank`.
    mesh_coords coords(int r) const { return shape().coords(r); }
    /// The rank at `c`.
    int rank_of(const mesh_coords& c) const { return shape().rank_of(c); }

    /// The communicator of this rank's group spanned by `axes` (the ranks that differ
    /// from this one only along those axes), ranked row-major over those axes. The groups of
    /// all axis sets lie in one array, indexed by the sets' bits: `sub(axis_set{})` points to
    /// the first (tensor_record::sub).
    const communicator& sub(axis_set axes) const { return state_->subs[axes.bits]; }
    /// The communicator of this rank's group spanned by axes `A...`.
    template <fixed_string... A>
    const communicator& sub() const {
        return sub(axes<A...>());
    }

    /// The mesh ranks of the group spanned by `axes` that holds `rank` (default: this one).
    std::vector<int> group_ranks(axis_set axes) const { return group_ranks(axes, rank()); }
    std::vector<int> group_ranks(axis_set axes, int r) const {
        return shape().group_ranks(r, axes);
    }

    /// A copy of the mesh with the dataset strategy shard() applies to inputs and outputs
    /// without a strategy; `data_parallel` splits their batch dimension over axis
    /// `data_axis` (the first axis by default). Throws if the mesh has no such axis.
    mesh with_dataset_strategy(dataset_strategy s, std::string_view data_axis = {}) const {
        mesh m = *this;
        m.dataset_ = s;
        m.data_axis_ = data_axis.empty() ? 0 : shape().index(data_axis);
        return m;
    }
    /// The dataset strategy (see `with_dataset_strategy`).
    dataset_strategy dataset() const noexcept { return dataset_; }
    /// The data-parallel axis of the dataset strategy.
    std::size_t data_axis() const noexcept { return data_axis_; }

    /// Whether two meshes are the same mesh object (copies of one construction).
    friend bool operator==(const mesh& a, const mesh& b) noexcept { return a.state_ == b.state_; }

    /// Prints "mesh(dp=2, mp=4)".
    friend std::ostream& operator<<(std::ostream& os, const mesh& m) { return os << m.shape(); }

    /// A drawing of the rank grid (the last axis across, the one before down, one block
    /// per combination of the leading axes).
    std::string draw() const {
        const auto& s = shape();
        const int cols = s.sizes[ndim - 1];
        const int rows = ndim >= 2 ? s.sizes[ndim - 2] : 1;
        const int blocks = s.size() / (rows * cols);
        const std::size_t width = std::to_string(s.size() - 1).size();
        std::string out = "mesh(" + s.to_string() + ")\n";
        for (int b = 0; b < blocks; ++b) {
            if (ndim > 2) {
                const auto lead = s.coords(b * rows * cols);
                out += "[";
                for (std::size_t i = 0; i + 2 < ndim; ++i)
                    out += (i ? ", " : "") + std::string(axis_names[i].view()) + "=" +
                           std::to_string(lead[i]);
                out += "]\n";
            }
            for (int r = 0; r < rows; ++r) {
                for (int c = 0; c < cols; ++c) {
                    const auto cell = std::to_string(b * rows * cols + r * cols + c);
                    out += std::string(width + 1 - cell.size(), ' ') + cell;
                }
                out += '\n';
            }
        }
        return out;
    }

private:
    struct state {
        state(const mesh_shape& s, const communicator& parent)
            : shape(s) {
            const communicator base = parent.dup();
            const auto all = shape.all_axes();
            subs.reserve(std::size_t(1) << ndim);
            for (std::uint32_t bits = 0; bits < all.bits; ++bits) {
                const axis_set axes{bits};
                subs.push_back(base.split(shape.group_color(base.rank(), axes),
                                          shape.group_rank(base.rank(), axes)));
            }
            subs.push_back(base);
        }
        mesh_shape shape;
        std::vector<communicator> subs; // indexed by axis_set bits; the last is the whole mesh
    };

    static mesh_shape make_shape(const communicator& comm, const std::array<int, ndim>& sizes) {
        static_vector<axis_name, max_mesh_axes> names;
        static_vector<int, max_mesh_axes> counts;
        for (std::size_t i = 0; i < ndim; ++i) {
            names.push_back(axis_names[i]);
            counts.push_back(sizes[i]);
        }
        try {
            return mesh_shape::fit(names, counts, comm.size());
        } catch (const std::invalid_argument& e) {
            throw error(e.what());
        }
    }

    std::shared_ptr<const state> state_;
    dataset_strategy dataset_ = dataset_strategy::unset;
    std::size_t data_axis_ = 0;
};

/// A `mesh<...>` type.
template <class M>
concept mesh_type = requires(const M& m) {
    { M::ndim } -> std::convertible_to<std::size_t>;
    M::axis_names;
    { m.shape() } -> std::same_as<const mesh_shape&>;
    { m.comm() } -> std::same_as<const communicator&>;
};

/// A mesh type that names the allocator of the shards of tensors on it
/// (`M::shard_allocator<T>`, e.g. `node_shared<mesh<...>>`, core/node_shared.hpp); other
/// mesh types keep xtensor's default.
template <class M>
concept has_shard_allocator = mesh_type<M> && requires {
    typename M::template shard_allocator<double>;
};

} // namespace xshard
