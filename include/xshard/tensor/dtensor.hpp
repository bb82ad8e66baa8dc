#pragma once
/// \file
/// The distributed tensor: a mesh, a global shape, a layout and this rank's shard.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/subarray.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>

#include <xtensor/xtensor.hpp>

#include <array>
#include <climits>
#include <concepts>
#include <cstddef>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

template <std::size_t N, class Shape>
std::array<std::size_t, N> to_array(const Shape& shape) {
    std::array<std::size_t, N> a{};
    std::size_t i = 0;
    for (auto e : shape)
        if (i < N)
            a[i++] = std::size_t(e);
    return a;
}

/// Tag of the internal constructor that skips the (collective) checks.
struct unchecked_t {};
inline constexpr unchecked_t unchecked{};

/// `l` if it is a layout of a rank-`rank` tensor that fits `mesh`; throws xshard::error
/// naming the problem otherwise. Every rank holds the same layout and mesh, so every rank
/// throws alike.
inline const layout& checked_layout(const layout& l, std::size_t rank, const mesh_shape& mesh) {
    if (l.dynamic)
        throw error("xshard: dynamic_layout() is a template argument, not a layout");
    if (l.rank() != rank)
        throw error("xshard: the layout " + l.to_string() + " has rank " +
                    std::to_string(l.rank()) + " but the tensor has rank " + std::to_string(rank));
    try {
        l.validate(mesh);
    } catch (const std::invalid_argument& e) {
        throw error(e.what());
    }
    return l;
}

struct no_layout {};

/// The layout a tensor of layout argument L gets: L itself, or the run-time layout
/// `given` (checked) when L is `dynamic_layout(rank)`. A `given` that contradicts a static
/// L is an error.
template <layout L>
const layout& layout_for(const layout& given, const mesh_shape& mesh) {
    if constexpr (L.dynamic) {
        return checked_layout(given, L.rank(), mesh);
    } else {
        static constexpr layout fixed = L;
        if (!(given == L))
            throw error("xshard: the layout " + given.to_string() +
                        " contradicts the tensor's layout type " + L.to_string());
        return fixed;
    }
}

} // namespace detail

namespace detail {
/// The shard type of a dtensor of element type T and rank N on mesh type Mesh.
template <class T, std::size_t N, class Mesh>
struct shard_of {
    using type = xt::xtensor<T, N>;
};
template <class T, std::size_t N, has_shard_allocator Mesh>
struct shard_of<T, N, Mesh> {
    using type = xt::xtensor<T, N, XTENSOR_DEFAULT_LAYOUT,
                             typename Mesh::template shard_allocator<T>>;
};
} // namespace detail

/// A tensor of element type T and global shape `shape()`, laid out over the axes of a mesh
/// of type Mesh as layout L says; this rank holds `local()`, an `xt::xtensor` (an ordinary
/// xtensor expression: use it with views, reductions, assignment).
///
/// L is normally a layout literal, `dtensor<double, M, "[dp, mp]">`: the layout is part of
/// the type, so operations' output layouts and the candidate steps of redistributions are
/// computed at compile time (which candidate runs, and its geometry, are decided at run
/// time when a plan is built). With
/// `L = dynamic_layout(rank)` the layout is a run-time value (`layout()`), chosen when the
/// tensor is made; the same planner runs then at run time.
///
/// Copies are deep (the shard is copied); moves are cheap. The mesh is shared.
template <class T, mesh_type Mesh, layout L>
class dtensor {
    static_assert(mpi_datatype<T>,
                  "xshard: the element type of a distributed tensor must be an MPI datatype "
                  "(an arithmetic or complex type, or one given a datatype_traits)");
    static_assert(L.check(Mesh::axis_names) != layout_problem::unknown_axis,
                  "xshard: the layout names an axis the mesh does not have");
    static_assert(L.check(Mesh::axis_names) != layout_problem::axis_used_twice,
                  "xshard: the layout uses a mesh axis twice");

public:
    using value_type = T;
    using mesh_type = Mesh;
    /// The tensor's rank (number of dimensions).
    static constexpr std::size_t rank = L.rank();
    using shape_type = std::array<std::size_t, rank>;
    /// The shard: an xtensor, with the mesh type's allocator when it names one
    /// (`node_shared<M>`: node storage), xtensor's default otherwise.
    using local_type = typename detail::shard_of<T, rank, Mesh>::type;
    /// The layout template argument (`dynamic_layout(rank)` for run-time layouts).
    static constexpr xshard::layout static_layout = L;
    /// Marks distributed operands for xshard's operators.
    static constexpr bool is_distributed = true;

    /// The layout.
    const xshard::layout& layout() const noexcept {
        if constexpr (L.dynamic)
            return layout_;
        else
            return static_layout;
    }

    /// Wraps `local` as this rank's shard of a tensor of global shape `shape` (for a
    /// dynamic layout, `l` is the layout). Collective (an all-reduce and an all-gather of
    /// one int per rank): throws `xshard::error` on every rank if any rank's shard does not
    /// have the shape the layout gives it or the ranks disagree on the global shape,
    /// naming the rank and both shapes.
    dtensor(const Mesh& mesh, const shape_type& shape, local_type local,
            const xshard::layout& l = L)
        : dtensor(detail::unchecked, mesh, shape, std::move(local), l) {
        check_shard();
    }

    /// Internal: wraps without the collective check (the caller guarantees the shape).
    dtensor(detail::unchecked_t, const Mesh& mesh, const shape_type& shape, local_type local,
            const xshard::layout& l = L)
        : mesh_(mesh)
        , shape_(shape)
        , local_(std::move(local)) {
        if constexpr (L.dynamic)
            layout_ = detail::layout_for<L>(l, mesh.shape());
    }

    /// Evaluates a lazy expression of the same layout into a new tensor.
    template <class E>
    requires(std::remove_cvref_t<E>::is_distributed &&
             !std::same_as<std::remove_cvref_t<E>, dtensor>) dtensor(E&& e)
        : dtensor(detail::unchecked, e.mesh(), e.shape(), local_type(std::forward<E>(e).local()),
                  e.layout()) {
        static_assert(std::remove_cvref_t<E>::static_layout == L,
                      "xshard: initialising from a tensor of another layout; call "
                      "xshard::redistribute<layout>(tensor) first");
    }

    dtensor(const dtensor&) = default;
    dtensor(dtensor&&) noexcept = default;
    dtensor& operator=(const dtensor&) = default;
    dtensor& operator=(dtensor&&) noexcept = default;

    /// Assigns a lazy expression of the same layout, mesh and shape (evaluated locally).
    template <class E>
    requires(std::remove_cvref_t<E>::is_distributed &&
             !std::same_as<std::remove_cvref_t<E>, dtensor>) dtensor&
    operator=(E&& e) {
        static_assert(std::remove_cvref_t<E>::static_layout == L,
                      "xshard: assigning a tensor of another layout; call "
                      "xshard::redistribute<layout>(tensor) first");
        if (!(e.mesh() == mesh_) || e.shape() != shape_ || !(e.layout() == layout()))
            throw error("xshard: assigning a distributed tensor of another mesh, shape or layout");
        local_ = std::forward<E>(e).local();
        return *this;
    }

    /// The mesh.
    const Mesh& mesh() const noexcept { return mesh_; }
    /// The global shape.
    const shape_type& shape() const noexcept { return shape_; }
    /// The number of elements of the global tensor.
    std::size_t size() const { return volume(shape_); }

    /// This rank's shard.
    local_type& local() & noexcept { return local_; }
    const local_type& local() const& noexcept { return local_; }
    local_type&& local() && noexcept { return std::move(local_); }

    /// The block of the global tensor this rank holds.
    box<rank> block() const { return block(mesh_.rank()); }
    /// The block any rank of the mesh holds (no communication).
    box<rank> block(int r) const { return block_of(layout(), mesh_.shape(), shape_, r); }

    /// "dtensor [dp, mp] (6, 5) on mesh(dp=2, mp=2)".
    friend std::ostream& operator<<(std::ostream& os, const dtensor& t) {
        return os << "dtensor " << t.layout().to_string() << ' ' << detail::shape_string(t.shape_)
                  << " on mesh(" << t.mesh_.shape().to_string() << ")";
    }

private:
    void check_shard() const {
        const auto expected = block().extent;
        const auto actual = detail::to_array<rank>(local_.shape());
        // One all-reduce: the range of each global extent, and the lowest rank whose shard
        // has the wrong shape (this rank, or the size when it is right).
        const auto& c = mesh_.comm();
        const bool wrong = expected != actual;
        std::array<unsigned long long, rank + 1> v{};
        for (std::size_t d = 0; d < rank; ++d)
            v[d] = shape_[d];
        v[rank] = static_cast<unsigned long long>(wrong ? c.rank() : c.size());
        const auto r = value_ranges(c, v);
        for (std::size_t d = 0; d < rank; ++d)
            if (!r[d].agrees())
                throw error("xshard: from_local: the ranks disagree on the global shape "
                            "(dimension " + std::to_string(d) + " from " +
                            std::to_string(r[d].least) + " to " + std::to_string(r[d].most) +
                            "; this rank has " + detail::shape_string(shape_) + ")");
        const auto first = r[rank].least;
        if (first == static_cast<unsigned long long>(c.size()))
            return;
        // Error path: count the wrong ranks; the first describes its shard to every rank.
        int wrong_ranks = wrong ? 1 : 0;
        allreduce(c, std::span(&wrong_ranks, 1), reduction::sum);
        std::optional<std::string> mine;
        if (static_cast<unsigned long long>(mesh_.rank()) == first)
            mine = "xshard: from_local: the local shard of rank " + std::to_string(first) +
                   " has shape " + detail::shape_string(actual) + " but layout " +
                   layout().to_string() + " on mesh(" + mesh_.shape().to_string() + ") gives it " +
                   detail::shape_string(expected) + " of global shape " +
                   detail::shape_string(shape_) +
                   (wrong_ranks > 1 ? " (" + std::to_string(wrong_ranks) + " ranks are wrong)"
                                    : std::string());
        agree_on_error(c, mine);
    }

    Mesh mesh_;
    shape_type shape_;
    local_type local_;
    [[no_unique_address]] std::conditional_t<L.dynamic, xshard::layout, detail::no_layout>
        layout_{};
};

/// Whether T is a distributed tensor or a lazy expression of distributed tensors.
template <class T>
concept distributed = std::remove_cvref_t<T>::is_distributed;

/// A `dtensor<...>` (not an expression).
template <class D>
concept distributed_tensor = distributed<D> && requires(const D& d) {
    typename std::remove_cvref_t<D>::local_type;
    d.block();
};

/// Wraps an existing local shard: `local` is this rank's block of a tensor of global shape
/// `shape` laid out as L. Collective; throws on every rank if a shard has the wrong shape
/// (see the dtensor constructor).
template <layout L, mesh_type Mesh, class T, std::size_t N>
dtensor<T, Mesh, L> from_local(const Mesh& mesh, const std::array<std::size_t, N>& shape,
                               xt::xtensor<T, N> local) {
    static_assert(L.rank() == N, "xshard: the layout's rank differs from the tensor's");
    return dtensor<T, Mesh, L>(mesh, shape, std::move(local));
}

/// `from_local` with a run-time layout.
template <mesh_type Mesh, class T, std::size_t N>
dtensor<T, Mesh, dynamic_layout(N)> from_local(const Mesh& mesh,
                                               const std::array<std::size_t, N>& shape,
                                               xt::xtensor<T, N> local, const layout& l) {
    return dtensor<T, Mesh, dynamic_layout(N)>(mesh, shape, std::move(local), l);
}

} // namespace xshard
