#pragma once
/// \file
/// Making distributed tensors: from a global array (held by every rank or by one), and
/// filled with constants or random numbers.
///
/// Each function takes the layout as its template argument L; with
/// `L = dynamic_layout(rank)` it takes the run-time layout as its last argument instead.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <climits>
#include <cstddef>
#include <random>
#include <vector>

namespace xshard {

namespace detail {

/// Whether the rank at `c` is the one of its replica group that holds the values of a
/// partial tensor made from a full one (coordinate 0 on every partial axis); the others
/// hold zeros, so that the terms reduce to the full values (for sum; max and min keep
/// every term equal instead).
XSHARD_DECL bool holds_term(const layout& l, const mesh_shape& mesh, const mesh_coords& c);

/// The strided view of `global` covering `b`.
template <class E, std::size_t N>
auto view_of(E&& global, const box<N>& b) {
    xt::xstrided_slice_vector slices;
    for (std::size_t d = 0; d < N; ++d)
        slices.push_back(xt::range(b.offset[d], b.offset[d] + b.extent[d]));
    return xt::strided_view(std::forward<E>(global), slices);
}

/// The mesh axes off the splitting ones: ranks differing only along them share a block.
inline axis_set spread_axes(const layout& l, const mesh_shape& mesh) {
    return l.replicated_axes(mesh) | l.partial_axes(mesh);
}

/// The shape of an array every rank of `mesh` says it holds whole, checked to be the same on
/// every rank: otherwise every rank throws, naming the extents seen (or the lowest rank whose
/// array has another number of dimensions than `lay`). Collective: one all-reduce of
/// 2N + 1 integers.
template <std::size_t N, class Mesh, class G>
std::array<std::size_t, N> agreed_shape(const Mesh& mesh, const G& g, const layout& lay) {
    // One all-reduce: the lowest rank with a wrong dimension count (this rank, or the size
    // when it has none), and the range of each extent.
    const auto& c = mesh.comm();
    const bool wrong_rank = g.dimension() != N;
    std::array<unsigned long long, N + 1> v{};
    v[0] = static_cast<unsigned long long>(wrong_rank ? c.rank() : c.size());
    for (std::size_t d = 0; d < N; ++d)
        v[1 + d] = wrong_rank ? 0 : g.shape()[d];
    const auto r = value_ranges(c, v);
    if (r[0].least < static_cast<unsigned long long>(c.size()))
        throw error("xshard: distribute: the array of rank " + std::to_string(r[0].least) +
                    " has another number of dimensions than the layout " + lay.to_string() +
                    " (" + std::to_string(N) + ")");
    std::array<std::size_t, N> shape{};
    for (std::size_t d = 0; d < N; ++d) {
        if (!r[1 + d].agrees())
            throw error("xshard: distribute: the ranks hold arrays of different shapes "
                        "(dimension " + std::to_string(d) + " has extents from " +
                        std::to_string(r[1 + d].least) + " to " + std::to_string(r[1 + d].most) +
                        "); every rank must pass the same global array");
        shape[d] = static_cast<std::size_t>(r[1 + d].most);
    }
    return shape;
}

} // namespace detail

/// Distributes a global array that every rank holds: each rank keeps a copy of its block.
/// For a partial(sum) layout one rank of each group along the partial axes keeps the values
/// and the others zeros, so that the terms sum to the array. The arrays' shapes are checked
/// to agree (the values are not): arrays of different shapes, or of another number of
/// dimensions than the layout on some rank, throw xshard::error on every rank.
/// Collective: one all-reduce of 2 * rank + 1 integers.
template <layout L, mesh_type Mesh, class E>
auto distribute(const Mesh& mesh, const xt::xexpression<E>& global, const layout& l = L) {
    using T = typename E::value_type;
    constexpr std::size_t N = L.rank();
    const auto& lay = detail::layout_for<L>(l, mesh.shape());
    const auto& g = global.derived_cast();
    const auto shape = detail::agreed_shape<N>(mesh, g, lay);
    const auto c = mesh.coords();
    typename dtensor<T, Mesh, L>::local_type local =
        detail::view_of(g, block_of(lay, mesh.shape(), shape, c));
    if (!detail::holds_term(lay, mesh.shape(), c))
        local.fill(T{});
    return dtensor<T, Mesh, L>(detail::unchecked, mesh, shape, std::move(local), lay);
}

/// Distributes a global array that only rank `root` holds (the others pass anything, e.g.
/// an empty xtensor: its shape and contents are ignored there). The root sends each
/// distinct block once, straight out of the array (MPI subarray datatypes, no packing);
/// each block's first holder then broadcasts it to the ranks that share it. No rank but the
/// root holds more than its block. Collective over the mesh.
template <layout L, mesh_type Mesh, class T, std::size_t N>
dtensor<T, Mesh, L> distribute_from(const Mesh& mesh, const xt::xtensor<T, N>& global, int root,
                                    const layout& l = L) {
    static_assert(L.rank() == N, "xshard: the layout's rank differs from the tensor's");
    const auto& lay = detail::layout_for<L>(l, mesh.shape());
    const auto& comm = mesh.comm();
    if (root < 0 || root >= comm.size())
        throw error("xshard: distribute_from: root " + std::to_string(root) +
                    " is not a rank of the mesh");
    std::array<unsigned long long, N> dims{};
    for (std::size_t d = 0; d < N; ++d)
        dims[d] = comm.rank() == root ? global.shape()[d] : 0;
    if constexpr (N > 0)
        bcast(comm, dims, root);
    std::array<std::size_t, N> shape{};
    for (std::size_t d = 0; d < N; ++d)
        shape[d] = std::size_t(dims[d]);

    const auto& ms = mesh.shape();
    const auto spread = detail::spread_axes(lay, ms);
    const auto c = mesh.coords();
    const auto b = block_of(lay, ms, shape, c);
    auto local = dtensor<T, Mesh, L>::local_type::from_shape(b.extent);

    std::vector<request> pending;
    message_batch sends;
    std::vector<derived_datatype> types;
    if (ms.group_rank(mesh.rank(), spread) == 0 && !b.empty())
        pending.push_back(irecv(comm, std::span(local.data(), local.size()), root, 0));
    if (comm.rank() == root) {
        for (int r = 0; r < comm.size(); ++r) {
            const auto rb = block_of(lay, ms, shape, r);
            if (ms.group_rank(r, spread) != 0 || rb.empty())
                continue;
            types.push_back(detail::box_datatype<T>(shape, rb));
            sends.isend(comm, global.data(), 1, types.back().native(), r, 0);
        }
    }
    wait_all(pending);
    sends.wait_all();
    // The owner (coordinate 0 on the spread axes) shares the block with its group; along
    // partial(sum) axes only one term keeps the values.
    if (!b.empty() && !spread.empty())
        bcast(mesh.sub(spread), std::span(local.data(), local.size()), 0);
    if (!detail::holds_term(lay, ms, c))
        local.fill(T{});
    return dtensor<T, Mesh, L>(detail::unchecked, mesh, shape, std::move(local), lay);
}

/// A tensor of global shape `shape` with every element `value`.
template <class T, layout L, mesh_type Mesh>
dtensor<T, Mesh, L> full(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape, T value,
                         const layout& l = L) {
    const auto& lay = detail::layout_for<L>(l, mesh.shape());
    const auto c = mesh.coords();
    auto local =
        dtensor<T, Mesh, L>::local_type::from_shape(block_of(lay, mesh.shape(), shape, c).extent);
    local.fill(detail::holds_term(lay, mesh.shape(), c) ? value : T{});
    return dtensor<T, Mesh, L>(detail::unchecked, mesh, shape, std::move(local), lay);
}

/// A tensor of zeros.
template <class T, layout L, mesh_type Mesh>
dtensor<T, Mesh, L> zeros(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape,
                          const layout& l = L) {
    return full<T, L>(mesh, shape, T(0), l);
}

/// A tensor of ones.
template <class T, layout L, mesh_type Mesh>
dtensor<T, Mesh, L> ones(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape,
                         const layout& l = L) {
    return full<T, L>(mesh, shape, T(1), l);
}

/// A tensor filled by drawing `dist(engine)` for every global element in row-major order
/// and keeping this rank's block: the same global tensor whatever the layout, and the same
/// as xtensor's serial `xt::random` functions with the same engine and distribution. Each
/// rank draws up to the last element of its block (O(global size) draws, no communication).
template <layout L, mesh_type Mesh, class Engine, class Distribution>
auto generate(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape, Engine engine,
              Distribution dist, const layout& l = L) {
    using T = typename Distribution::result_type;
    constexpr std::size_t N = L.rank();
    const auto& lay = detail::layout_for<L>(l, mesh.shape());
    const auto c = mesh.coords();
    const auto b = block_of(lay, mesh.shape(), shape, c);
    auto local = dtensor<T, Mesh, L>::local_type::from_shape(b.extent);
    if constexpr (N == 0) {
        local() = dist(engine);
    } else if (!b.empty()) {
        // Walk the global row-major order, one run of the last dimension at a time.
        std::size_t drawn = 0;            // global elements drawn so far
        std::array<std::size_t, N> idx{}; // local index of the current run (last dim = 0)
        T* out = local.data();
        const std::size_t run = b.extent[N - 1];
        for (std::size_t k = 0; k < local.size(); k += run) {
            std::size_t start = 0; // global linear index of the run's first element
            for (std::size_t d = 0; d < N; ++d)
                start = start * shape[d] + b.offset[d] + idx[d];
            for (; drawn < start; ++drawn)
                (void)dist(engine);
            for (std::size_t i = 0; i < run; ++i, ++drawn)
                *out++ = dist(engine);
            for (std::size_t d = N - 1; d-- > 0;) { // advance to the next run
                if (++idx[d] < b.extent[d])
                    break;
                idx[d] = 0;
            }
        }
    }
    if (!detail::holds_term(lay, mesh.shape(), c))
        local.fill(T{});
    return dtensor<T, Mesh, L>(detail::unchecked, mesh, shape, std::move(local), lay);
}

/// Uniform reals in [lower, upper): the gathered tensor equals
/// `xt::random::rand<T>(shape, lower, upper, engine)` with `std::mt19937 engine(seed)`.
template <class T, layout L, mesh_type Mesh>
auto rand(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape, unsigned seed,
          T lower = 0, T upper = 1, const layout& l = L) {
    return generate<L>(mesh, shape, std::mt19937(seed),
                       std::uniform_real_distribution<T>(lower, upper), l);
}

/// Normal numbers: equals `xt::random::randn<T>(shape, mean, std_dev, engine)`.
template <class T, layout L, mesh_type Mesh>
auto randn(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape, unsigned seed,
           T mean = 0, T std_dev = 1, const layout& l = L) {
    return generate<L>(mesh, shape, std::mt19937(seed), std::normal_distribution<T>(mean, std_dev),
                       l);
}

/// Integers in [lower, upper): equals `xt::random::randint<T>(shape, lower, upper, engine)`.
template <class T, layout L, mesh_type Mesh>
auto randint(const Mesh& mesh, const std::array<std::size_t, L.rank()>& shape, unsigned seed,
             T lower, T upper, const layout& l = L) {
    return generate<L>(mesh, shape, std::mt19937(seed),
                       std::uniform_int_distribution<T>(lower, T(upper - 1)), l);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/tensor/distribute.ipp>
#endif
