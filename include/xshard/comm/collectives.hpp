#pragma once
/// \file
/// Typed MPI collectives and point-to-point calls over contiguous buffers.
///
/// A buffer is any contiguous sized range of an MPI datatype: `std::span`, `std::vector`,
/// `std::array`, an xtensor container (`xt::xtensor`, `xt::xarray`) or a contiguous view.
/// Each function checks the sizes it can check locally and throws `xshard::error` on a
/// mismatch (a precondition violation: the sizes must agree on every rank), and turns MPI
/// errors into `mpi_error`. Every blocking call `f` has a nonblocking twin `if` that
/// returns a `request`; its buffers must stay alive until the request completes.
///
/// Counts have no int limit: a buffer of more than INT_MAX elements travels as one item of
/// a derived contiguous datatype (and is reduced by xshard's own operator, since MPI's
/// predefined operators take only predefined datatypes). The counts and displacements of
/// the v-collectives are MPI's ints.
///
/// Costs are those of the MPI library (Open MPI's tuned collectives); with n the bytes
/// of the result and p the communicator size, the usual lower bounds are: all-gather and
/// reduce-scatter (p-1)/p·n bytes per rank, all-reduce 2(p-1)/p·n, broadcast n,
/// all-to-all (p-1)/p·n.

#include <xshard/compiled.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/reduction.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/comm/watch.hpp>

#include <mpi.h>

#include <climits>
#include <complex>
#include <cstddef>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace xshard {

/// A contiguous sized range of an MPI datatype.
template <class B>
concept contiguous_buffer = std::ranges::contiguous_range<B> && std::ranges::sized_range<B> &&
    mpi_datatype<std::ranges::range_value_t<B>>;

/// A contiguous buffer whose elements can be written.
template <class B>
concept output_buffer = contiguous_buffer<B> &&
    !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<B>>>;

/// `count` items of MPI datatype `type` at `data`: a type-erased buffer (the element type
/// known only at run time), or with `bottom`, the memory a derived datatype of absolute
/// addresses describes.
struct mpi_buffer {
    void* data = nullptr;
    std::size_t count = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;

    /// One item of `type` on MPI_BOTTOM (see `derived_datatype::at_addresses`).
    static mpi_buffer bottom(const derived_datatype& type) {
        return {MPI_BOTTOM, 1, type.native()};
    }
};

/// Element counts and displacements of the v-collectives.
using counts_view = std::span<const int>;

namespace detail {

template <class B>
using buffer_value_t = std::remove_cv_t<std::ranges::range_value_t<B>>;

/// A datatype argument of an MPI call that may own a derived datatype (for counts beyond
/// int): the owner lives as long as the call's argument tuple. MPI keeps a freed type alive
/// while an operation started with it is pending.
struct wire_type {
    MPI_Datatype type = MPI_DATATYPE_NULL;
    std::shared_ptr<const derived_datatype> owner;
    operator MPI_Datatype() const noexcept { return type; }
};

/// `n` items of `element` as MPI's (count, datatype): (n, element) when n fits an int, else
/// one item of a derived contiguous type of n elements.
XSHARD_DECL std::pair<int, wire_type> wire_count(std::size_t n, MPI_Datatype element);

/// `n` elements of T as MPI's (count, datatype).
template <class T>
std::pair<int, wire_type> wire_count(std::size_t n) {
    return wire_count(n, datatype_of<T>());
}

/// The MPI operator for items of a derived contiguous type of T (see `wire_count`): reduces
/// every element of each item with `combine`.
template <class T, reduction R>
void reduce_items(void* in, void* inout, int* len, MPI_Datatype* type) {
    MPI_Count bytes = 0;
    MPI_Type_size_x(*type, &bytes);
    const auto n = static_cast<std::size_t>(*len) * static_cast<std::size_t>(bytes) / sizeof(T);
    combine(static_cast<T*>(inout), static_cast<const T*>(in), static_cast<const T*>(inout), n, R);
}

/// The operator of `r` for elements of T travelling as `type`: MPI's (or T's own) for
/// elements, xshard's `reduce_items` for a derived contiguous type.
template <class T>
MPI_Op op_for(reduction r, const wire_type& type) {
    const MPI_Op op = op_of<T>(r); // also rejects what T does not define
    if (!type.owner)
        return op;
    static const user_op sum(reduce_items<T, reduction::sum>);
    static const user_op prod(reduce_items<T, reduction::prod>);
    static const user_op max(reduce_items<T, reduction::max>);
    static const user_op min(reduce_items<T, reduction::min>);
    switch (r) {
    case reduction::sum:
        return sum.native();
    case reduction::prod:
        return prod.native();
    case reduction::max:
        return max.native();
    case reduction::min:
        return min.native();
    }
    return op;
}

inline void require(bool condition, std::string_view operation, const std::string& what) {
    if (!condition)
        throw error("xshard: " + std::string(operation) + ": " + what);
}

template <class B>
auto* data_of(B&& buffer) {
    return std::ranges::data(buffer);
}

template <class S, class R>
void require_same_type() {
    static_assert(std::is_same_v<buffer_value_t<S>, buffer_value_t<R>>,
                  "xshard: the send and receive buffers of a collective must have the same "
                  "element type");
}

/// Runs a blocking MPI call on a tuple of arguments.
template <class F, class Args>
void run(F mpi_call, std::string_view name, Args&& args) {
    check_mpi(std::apply(mpi_call, std::forward<Args>(args)), name);
}

/// The bytes of a buffer.
template <class B>
std::size_t bytes_of(const B& buffer) {
    return std::ranges::size(buffer) * sizeof(buffer_value_t<B>);
}
XSHARD_DECL std::size_t bytes_of(const mpi_buffer& buffer);

/// Runs a blocking collective on a tuple of arguments with its wait watched (see
/// comm/watch.hpp): a watched nonblocking barrier, then the blocking call.
template <class B, class Args>
void run_watched(B blocking, std::string_view name, const communicator& c, std::size_t bytes,
                 Args&& args) {
    require_whole(c, name);
    if (c.size() > 1) {
        MPI_Request q = MPI_REQUEST_NULL;
        check_mpi(MPI_Ibarrier(c.native(), &q), "MPI_Ibarrier");
        watched_wait(std::span(&q, 1), name, c.native(), c.size(), bytes);
    }
    run(blocking, name, std::forward<Args>(args));
}

/// Starts a nonblocking MPI call on a tuple of arguments (the request is appended), whose
/// last element is the communicator, unless that is broken.
template <class F, class Args>
request start(F mpi_call, std::string_view name, Args&& args) {
    constexpr auto last = std::tuple_size_v<std::remove_cvref_t<Args>> - 1;
    if (is_broken(std::get<last>(args)))
        require_whole(communicator::borrow(std::get<last>(args)), name);
    MPI_Request handle = MPI_REQUEST_NULL;
    check_mpi(
        std::apply([&](auto... a) { return mpi_call(a..., &handle); }, std::forward<Args>(args)),
        name);
    return request(handle);
}

// Argument builders: one per collective, shared by its blocking and nonblocking forms.

inline auto barrier_args(const communicator& c) {
    return std::tuple(c.native());
}

template <class B>
auto bcast_args(const communicator& c, B& buffer, int root) {
    using T = buffer_value_t<B>;
    auto [count, type] = wire_count<T>(std::ranges::size(buffer));
    return std::tuple(static_cast<void*>(data_of(buffer)), count, type, root, c.native());
}

inline auto bcast_args(const communicator& c, const mpi_buffer& buffer, int root) {
    auto [count, type] = wire_count(buffer.count, buffer.type);
    return std::tuple(buffer.data, count, type, root, c.native());
}

template <class S, class R>
auto reduce_args(const communicator& c, const S& send, R& recv, reduction op, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(reducible<T>, "xshard: reductions need an element type with reduction_traits "
                                 "(arithmetic, complex, float16, bfloat16)");
    const auto n = std::ranges::size(send);
    require(c.rank() != root || std::ranges::size(recv) == n, "reduce",
            "the root's receive buffer must have the size of the send buffer");
    auto [count, type] = wire_count<T>(n);
    const MPI_Op mpi_op = op_for<T>(op, type);
    return std::tuple(static_cast<const void*>(data_of(send)),
                      c.rank() == root ? static_cast<void*>(data_of(recv)) : nullptr, count, type,
                      mpi_op, root, c.native());
}

template <class S, class R>
auto allreduce_args(const communicator& c, const S& send, R& recv, reduction op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(reducible<T>, "xshard: reductions need an element type with reduction_traits "
                                 "(arithmetic, complex, float16, bfloat16)");
    const auto n = std::ranges::size(send);
    require(std::ranges::size(recv) == n, "allreduce",
            "send and receive buffers must have the same size");
    auto [count, type] = wire_count<T>(n);
    const MPI_Op mpi_op = op_for<T>(op, type);
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      count, type, mpi_op, c.native());
}

template <class B>
auto allreduce_in_place_args(const communicator& c, B& buffer, reduction op) {
    using T = buffer_value_t<B>;
    static_assert(reducible<T>, "xshard: reductions need an element type with reduction_traits "
                                 "(arithmetic, complex, float16, bfloat16)");
    auto [count, type] = wire_count<T>(std::ranges::size(buffer));
    const MPI_Op mpi_op = op_for<T>(op, type);
    return std::tuple(MPI_IN_PLACE, static_cast<void*>(data_of(buffer)), count, type, mpi_op,
                      c.native());
}

template <class S, class R>
auto gather_args(const communicator& c, const S& send, R& recv, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(send);
    require(c.rank() != root || std::ranges::size(recv) == n * c.size(), "gather",
            "the root's receive buffer must hold size() send buffers");
    auto [count, type] = wire_count<T>(n);
    return std::tuple(static_cast<const void*>(data_of(send)), count, type,
                      static_cast<void*>(data_of(recv)), count, type, root, c.native());
}

template <class S, class R>
auto gatherv_args(const communicator& c, const S& send, R& recv, counts_view counts,
                  counts_view displs, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const bool is_root = c.rank() == root;
    require(!is_root || (counts.size() == std::size_t(c.size()) && displs.size() == counts.size()),
            "gatherv", "counts and displacements need one entry per rank");
    return std::tuple(static_cast<const void*>(data_of(send)),
                      to_int_count(std::ranges::size(send)), datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), is_root ? counts.data() : nullptr,
                      is_root ? displs.data() : nullptr, datatype_of<T>(), root, c.native());
}

template <class S, class R>
auto scatter_args(const communicator& c, const S& send, R& recv, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(recv);
    require(c.rank() != root || std::ranges::size(send) == n * c.size(), "scatter",
            "the root's send buffer must hold size() receive buffers");
    auto [count, type] = wire_count<T>(n);
    return std::tuple(static_cast<const void*>(data_of(send)), count, type,
                      static_cast<void*>(data_of(recv)), count, type, root, c.native());
}

template <class S, class R>
auto scatterv_args(const communicator& c, const S& send, counts_view counts, counts_view displs,
                   R& recv, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const bool is_root = c.rank() == root;
    require(!is_root || (counts.size() == std::size_t(c.size()) && displs.size() == counts.size()),
            "scatterv", "counts and displacements need one entry per rank");
    return std::tuple(
        static_cast<const void*>(data_of(send)), is_root ? counts.data() : nullptr,
        is_root ? displs.data() : nullptr, datatype_of<T>(), static_cast<void*>(data_of(recv)),
        to_int_count(std::ranges::size(recv)), datatype_of<T>(), root, c.native());
}

template <class S, class R>
auto allgather_args(const communicator& c, const S& send, R& recv) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(send);
    require(std::ranges::size(recv) == n * c.size(), "allgather",
            "the receive buffer must hold size() send buffers");
    auto [count, type] = wire_count<T>(n);
    return std::tuple(static_cast<const void*>(data_of(send)), count, type,
                      static_cast<void*>(data_of(recv)), count, type, c.native());
}

template <class S, class R>
auto allgatherv_args(const communicator& c, const S& send, R& recv, counts_view counts,
                     counts_view displs) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    require(counts.size() == std::size_t(c.size()) && displs.size() == counts.size(), "allgatherv",
            "counts and displacements need one entry per rank");
    require(std::size_t(counts[std::size_t(c.rank())]) == std::ranges::size(send), "allgatherv",
            "this rank's count must equal its send buffer's size");
    return std::tuple(static_cast<const void*>(data_of(send)),
                      to_int_count(std::ranges::size(send)), datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), counts.data(), displs.data(),
                      datatype_of<T>(), c.native());
}

template <class S, class R>
auto alltoall_args(const communicator& c, const S& send, R& recv) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(send);
    require(n % std::size_t(c.size()) == 0 && std::ranges::size(recv) == n, "alltoall",
            "send and receive buffers must have the same size, a multiple of size()");
    auto [count, type] = wire_count<T>(n / std::size_t(c.size()));
    return std::tuple(static_cast<const void*>(data_of(send)), count, type,
                      static_cast<void*>(data_of(recv)), count, type, c.native());
}

template <class S, class R>
auto alltoallv_args(const communicator& c, const S& send, counts_view send_counts,
                    counts_view send_displs, R& recv, counts_view recv_counts,
                    counts_view recv_displs) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto p = std::size_t(c.size());
    require(send_counts.size() == p && send_displs.size() == p && recv_counts.size() == p &&
                recv_displs.size() == p,
            "alltoallv", "counts and displacements need one entry per rank");
    return std::tuple(static_cast<const void*>(data_of(send)), send_counts.data(),
                      send_displs.data(), datatype_of<T>(), static_cast<void*>(data_of(recv)),
                      recv_counts.data(), recv_displs.data(), datatype_of<T>(), c.native());
}

template <class S, class R>
auto reduce_scatter_args(const communicator& c, const S& send, R& recv, counts_view counts,
                         reduction op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(reducible<T>, "xshard: reductions need an element type with reduction_traits "
                                 "(arithmetic, complex, float16, bfloat16)");
    require(counts.size() == std::size_t(c.size()), "reduce_scatter",
            "counts need one entry per rank");
    require(std::size_t(counts[std::size_t(c.rank())]) == std::ranges::size(recv), "reduce_scatter",
            "this rank's count must equal its receive buffer's size");
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      counts.data(), datatype_of<T>(), op_of<T>(op), c.native());
}

template <class S, class R>
auto reduce_scatter_block_args(const communicator& c, const S& send, R& recv, reduction op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(reducible<T>, "xshard: reductions need an element type with reduction_traits "
                                 "(arithmetic, complex, float16, bfloat16)");
    const auto n = std::ranges::size(recv);
    require(std::ranges::size(send) == n * c.size(), "reduce_scatter_block",
            "the send buffer must hold size() receive buffers");
    auto [count, type] = wire_count<T>(n);
    const MPI_Op mpi_op = op_for<T>(op, type);
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      count, type, mpi_op, c.native());
}

template <class B>
auto send_args(const communicator& c, const B& buffer, int dest, int tag) {
    using T = buffer_value_t<B>;
    auto [count, type] = wire_count<T>(std::ranges::size(buffer));
    return std::tuple(static_cast<const void*>(data_of(buffer)), count, type, dest, tag,
                      c.native());
}

template <class B>
auto recv_args(const communicator& c, B& buffer, int source, int tag) {
    using T = buffer_value_t<B>;
    auto [count, type] = wire_count<T>(std::ranges::size(buffer));
    return std::tuple(static_cast<void*>(data_of(buffer)), count, type, source, tag, c.native());
}

} // namespace detail

/// The MPI wrappers live in `xshard::mpi` (`xshard::mpi::gather` is MPI_Gather;
/// `xshard::gather` turns a distributed tensor into an array). Calls with a communicator
/// argument find them unqualified by argument-dependent lookup, since `communicator` is
/// declared there too.
namespace mpi {

/// Wildcards for receives.
inline constexpr int any_source = MPI_ANY_SOURCE;
inline constexpr int any_tag = MPI_ANY_TAG;

/// Blocks until every rank of `c` has called it.
inline void barrier(const communicator& c) {
    detail::run_watched(MPI_Barrier, "MPI_Barrier", c, 0, detail::barrier_args(c));
}
inline request ibarrier(const communicator& c) {
    return detail::start(MPI_Ibarrier, "MPI_Ibarrier", detail::barrier_args(c));
}

/// Copies `root`'s buffer into every rank's buffer (same size everywhere).
template <class B>
requires output_buffer<B&>
void bcast(const communicator& c, B&& buffer, int root) {
    detail::run_watched(MPI_Bcast, "MPI_Bcast", c, detail::bytes_of(buffer),
                        detail::bcast_args(c, buffer, root));
}
template <class B>
requires output_buffer<B&> request ibcast(const communicator& c, B&& buffer, int root) {
    return detail::start(MPI_Ibcast, "MPI_Ibcast", detail::bcast_args(c, buffer, root));
}

/// `bcast` of a type-erased buffer (see `mpi_buffer`).
inline void bcast(const communicator& c, const mpi_buffer& buffer, int root) {
    detail::run_watched(MPI_Bcast, "MPI_Bcast", c, detail::bytes_of(buffer),
                        detail::bcast_args(c, buffer, root));
}
inline request ibcast(const communicator& c, const mpi_buffer& buffer, int root) {
    return detail::start(MPI_Ibcast, "MPI_Ibcast", detail::bcast_args(c, buffer, root));
}

/// Element-wise reduction of every rank's `send` into `recv` at `root` (recv is ignored
/// elsewhere and may be empty there).
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void reduce(const communicator& c, const S& send, R&& recv, reduction op, int root) {
    detail::run_watched(MPI_Reduce, "MPI_Reduce", c, detail::bytes_of(send),
                        detail::reduce_args(c, send, recv, op, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce(const communicator& c, const S& send, R&& recv,
                                           reduction op, int root) {
    return detail::start(MPI_Ireduce, "MPI_Ireduce", detail::reduce_args(c, send, recv, op, root));
}

/// Element-wise reduction of every rank's `send` into every rank's `recv`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void allreduce(const communicator& c, const S& send, R&& recv, reduction op) {
    detail::run_watched(MPI_Allreduce, "MPI_Allreduce", c, detail::bytes_of(send),
                        detail::allreduce_args(c, send, recv, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iallreduce(const communicator& c, const S& send, R&& recv,
                                              reduction op) {
    return detail::start(MPI_Iallreduce, "MPI_Iallreduce",
                         detail::allreduce_args(c, send, recv, op));
}

/// In-place all-reduce: every rank's `buffer` becomes the reduction of all of them.
template <class B>
requires output_buffer<B&>
void allreduce(const communicator& c, B&& buffer, reduction op) {
    detail::run_watched(MPI_Allreduce, "MPI_Allreduce", c, detail::bytes_of(buffer),
                        detail::allreduce_in_place_args(c, buffer, op));
}
template <class B>
requires output_buffer<B&> request iallreduce(const communicator& c, B&& buffer, reduction op) {
    return detail::start(MPI_Iallreduce, "MPI_Iallreduce",
                         detail::allreduce_in_place_args(c, buffer, op));
}

/// Concatenates every rank's `send` (equal sizes) into `recv` at `root`, in rank order.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void gather(const communicator& c, const S& send, R&& recv, int root) {
    detail::run_watched(MPI_Gather, "MPI_Gather", c, detail::bytes_of(send),
                        detail::gather_args(c, send, recv, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request igather(const communicator& c, const S& send, R&& recv,
                                           int root) {
    return detail::start(MPI_Igather, "MPI_Igather", detail::gather_args(c, send, recv, root));
}

/// Gathers sends of different sizes: rank i's `send` lands at `recv[displs[i]]`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void gatherv(const communicator& c, const S& send, R&& recv, counts_view counts, counts_view displs,
             int root) {
    detail::run_watched(MPI_Gatherv, "MPI_Gatherv", c, detail::bytes_of(send),
                        detail::gatherv_args(c, send, recv, counts, displs, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request igatherv(const communicator& c, const S& send, R&& recv,
                                            counts_view counts, counts_view displs, int root) {
    return detail::start(MPI_Igatherv, "MPI_Igatherv",
                         detail::gatherv_args(c, send, recv, counts, displs, root));
}

/// Splits `root`'s `send` into size() equal pieces, piece i to rank i.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void scatter(const communicator& c, const S& send, R&& recv, int root) {
    detail::run_watched(MPI_Scatter, "MPI_Scatter", c, detail::bytes_of(recv),
                        detail::scatter_args(c, send, recv, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iscatter(const communicator& c, const S& send, R&& recv,
                                            int root) {
    return detail::start(MPI_Iscatter, "MPI_Iscatter", detail::scatter_args(c, send, recv, root));
}

/// Scatters pieces of different sizes: rank i receives `send[displs[i] .. +counts[i]]`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void scatterv(const communicator& c, const S& send, counts_view counts, counts_view displs,
              R&& recv, int root) {
    detail::run_watched(MPI_Scatterv, "MPI_Scatterv", c, detail::bytes_of(recv),
                        detail::scatterv_args(c, send, counts, displs, recv, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iscatterv(const communicator& c, const S& send,
                                             counts_view counts, counts_view displs, R&& recv,
                                             int root) {
    return detail::start(MPI_Iscatterv, "MPI_Iscatterv",
                         detail::scatterv_args(c, send, counts, displs, recv, root));
}

/// Concatenates every rank's `send` (equal sizes) into every rank's `recv`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void allgather(const communicator& c, const S& send, R&& recv) {
    detail::run_watched(MPI_Allgather, "MPI_Allgather", c, detail::bytes_of(send),
                        detail::allgather_args(c, send, recv));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iallgather(const communicator& c, const S& send, R&& recv) {
    return detail::start(MPI_Iallgather, "MPI_Iallgather", detail::allgather_args(c, send, recv));
}

/// All-gather of sends of different sizes: rank i's `send` lands at `recv[displs[i]]`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void allgatherv(const communicator& c, const S& send, R&& recv, counts_view counts,
                counts_view displs) {
    detail::run_watched(MPI_Allgatherv, "MPI_Allgatherv", c, detail::bytes_of(recv),
                        detail::allgatherv_args(c, send, recv, counts, displs));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iallgatherv(const communicator& c, const S& send, R&& recv,
                                               counts_view counts, counts_view displs) {
    return detail::start(MPI_Iallgatherv, "MPI_Iallgatherv",
                         detail::allgatherv_args(c, send, recv, counts, displs));
}

/// Piece j of every rank's `send` (size()/equal pieces) goes to rank j, where it lands
/// as piece i (i = the sender).
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void alltoall(const communicator& c, const S& send, R&& recv) {
    detail::run_watched(MPI_Alltoall, "MPI_Alltoall", c, detail::bytes_of(send),
                        detail::alltoall_args(c, send, recv));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ialltoall(const communicator& c, const S& send, R&& recv) {
    return detail::start(MPI_Ialltoall, "MPI_Ialltoall", detail::alltoall_args(c, send, recv));
}

/// All-to-all with per-peer counts and displacements (in elements).
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void alltoallv(const communicator& c, const S& send, counts_view send_counts,
               counts_view send_displs, R&& recv, counts_view recv_counts,
               counts_view recv_displs) {
    detail::run_watched(
        MPI_Alltoallv, "MPI_Alltoallv", c, detail::bytes_of(send),
        detail::alltoallv_args(c, send, send_counts, send_displs, recv, recv_counts, recv_displs));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ialltoallv(const communicator& c, const S& send,
                                              counts_view send_counts, counts_view send_displs,
                                              R&& recv, counts_view recv_counts,
                                              counts_view recv_displs) {
    return detail::start(
        MPI_Ialltoallv, "MPI_Ialltoallv",
        detail::alltoallv_args(c, send, send_counts, send_displs, recv, recv_counts, recv_displs));
}

/// Reduces every rank's `send` element-wise and leaves piece i (`counts[i]` elements, in
/// rank order) on rank i.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void reduce_scatter(const communicator& c, const S& send, R&& recv, counts_view counts,
                    reduction op) {
    detail::run_watched(MPI_Reduce_scatter, "MPI_Reduce_scatter", c, detail::bytes_of(send),
                        detail::reduce_scatter_args(c, send, recv, counts, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce_scatter(const communicator& c, const S& send, R&& recv,
                                                   counts_view counts, reduction op) {
    return detail::start(MPI_Ireduce_scatter, "MPI_Ireduce_scatter",
                         detail::reduce_scatter_args(c, send, recv, counts, op));
}

/// Reduce-scatter with equal pieces of `recv.size()` elements.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void reduce_scatter_block(const communicator& c, const S& send, R&& recv, reduction op) {
    detail::run_watched(MPI_Reduce_scatter_block, "MPI_Reduce_scatter_block", c,
                        detail::bytes_of(send),
                        detail::reduce_scatter_block_args(c, send, recv, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce_scatter_block(const communicator& c, const S& send,
                                                         R&& recv, reduction op) {
    return detail::start(MPI_Ireduce_scatter_block, "MPI_Ireduce_scatter_block",
                         detail::reduce_scatter_block_args(c, send, recv, op));
}

/// Sends `buffer` to rank `dest`.
template <contiguous_buffer B>
void send(const communicator& c, const B& buffer, int dest, int tag = 0) {
    detail::require_whole(c, "MPI_Send");
    auto q = detail::start(MPI_Isend, "MPI_Send", detail::send_args(c, buffer, dest, tag));
    detail::watched_wait(std::span(q.native(), 1), "MPI_Send", c.native(), c.size(),
                         detail::bytes_of(buffer), {true, true});
}
template <contiguous_buffer B>
request isend(const communicator& c, const B& buffer, int dest, int tag = 0) {
    return detail::start(MPI_Isend, "MPI_Isend", detail::send_args(c, buffer, dest, tag));
}

/// Receives exactly `buffer.size()` elements from rank `source`.
template <class B>
requires output_buffer<B&>
void recv(const communicator& c, B&& buffer, int source, int tag = 0) {
    detail::require_whole(c, "MPI_Recv");
    MPI_Request q = MPI_REQUEST_NULL;
    detail::check_mpi(std::apply([&](auto... a) { return MPI_Irecv(a..., &q); },
                                 detail::recv_args(c, buffer, source, tag)),
                      "MPI_Recv");
    detail::watched_wait(std::span(&q, 1), "MPI_Recv", c.native(), c.size(),
                         detail::bytes_of(buffer), {true, true});
}
template <class B>
requires output_buffer<B&> request irecv(const communicator& c, B&& buffer, int source,
                                         int tag = 0) {
    return detail::start(MPI_Irecv, "MPI_Irecv", detail::recv_args(c, buffer, source, tag));
}

/// Sends `send` to `dest` while receiving `recv` from `source` (no deadlock in rings).
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void sendrecv(const communicator& c, const S& send, int dest, R&& recv, int source, int tag = 0) {
    const auto out = detail::send_args(c, send, dest, tag);
    const auto in = detail::recv_args(c, recv, source, tag);
    detail::require_whole(c, "MPI_Sendrecv");
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    detail::check_mpi(MPI_Irecv(std::get<0>(in), std::get<1>(in), std::get<2>(in), source, tag,
                                c.native(), &q[0]),
                      "MPI_Sendrecv");
    detail::check_mpi(MPI_Isend(std::get<0>(out), std::get<1>(out), std::get<2>(out), dest, tag,
                                c.native(), &q[1]),
                      "MPI_Sendrecv");
    detail::watched_wait(q, "MPI_Sendrecv", c.native(), c.size(), detail::bytes_of(send),
                         {true, true});
}

} // namespace mpi

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/collectives.ipp>
#endif
