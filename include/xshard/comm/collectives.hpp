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
/// Costs are those of the MPI library (Open MPI's tuned collectives); with n the bytes
/// of the result and p the communicator size, the usual lower bounds are: all-gather and
/// reduce-scatter (p-1)/p·n bytes per rank, all-reduce 2(p-1)/p·n, broadcast n,
/// all-to-all (p-1)/p·n.

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>

#include <mpi.h>

#include <climits>
#include <complex>
#include <cstddef>
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

/// The reduction of a reducing collective.
enum class reduce_op { sum, prod, min, max };

/// Element counts and displacements of the v-collectives.
using counts_view = std::span<const int>;

namespace detail {

template <class B>
using buffer_value_t = std::remove_cv_t<std::ranges::range_value_t<B>>;

inline int to_count(std::size_t n, std::string_view operation) {
    if (n > static_cast<std::size_t>(INT_MAX))
        throw error("xshard: " + std::string(operation) + ": " + std::to_string(n) +
                    " elements exceed MPI's int count limit");
    return static_cast<int>(n);
}

inline void require(bool condition, std::string_view operation, const std::string& what) {
    if (!condition)
        throw error("xshard: " + std::string(operation) + ": " + what);
}

template <class B>
auto* data_of(B&& buffer) {
    return std::ranges::data(buffer);
}

template <class T>
MPI_Op native_op(reduce_op op) {
    if constexpr (!std::is_arithmetic_v<T>) {
        if (op == reduce_op::min || op == reduce_op::max)
            throw error("xshard: min and max are not defined for complex values");
    }
    switch (op) {
    case reduce_op::sum:
        return MPI_SUM;
    case reduce_op::prod:
        return MPI_PROD;
    case reduce_op::min:
        return MPI_MIN;
    case reduce_op::max:
        return MPI_MAX;
    }
    return MPI_OP_NULL;
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

/// Starts a nonblocking MPI call on a tuple of arguments (the request is appended).
template <class F, class Args>
request start(F mpi_call, std::string_view name, Args&& args) {
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
    return std::tuple(static_cast<void*>(data_of(buffer)),
                      to_count(std::ranges::size(buffer), "bcast"), datatype_of<T>(), root,
                      c.native());
}

template <class S, class R>
auto reduce_args(const communicator& c, const S& send, R& recv, reduce_op op, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(summable<T>, "xshard: reductions need an arithmetic or complex element type");
    const auto n = std::ranges::size(send);
    require(c.rank() != root || std::ranges::size(recv) == n, "reduce",
            "the root's receive buffer must have the size of the send buffer");
    return std::tuple(static_cast<const void*>(data_of(send)),
                      c.rank() == root ? static_cast<void*>(data_of(recv)) : nullptr,
                      to_count(n, "reduce"), datatype_of<T>(), native_op<T>(op), root, c.native());
}

template <class S, class R>
auto allreduce_args(const communicator& c, const S& send, R& recv, reduce_op op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(summable<T>, "xshard: reductions need an arithmetic or complex element type");
    const auto n = std::ranges::size(send);
    require(std::ranges::size(recv) == n, "allreduce",
            "send and receive buffers must have the same size");
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      to_count(n, "allreduce"), datatype_of<T>(), native_op<T>(op), c.native());
}

template <class B>
auto allreduce_in_place_args(const communicator& c, B& buffer, reduce_op op) {
    using T = buffer_value_t<B>;
    static_assert(summable<T>, "xshard: reductions need an arithmetic or complex element type");
    return std::tuple(MPI_IN_PLACE, static_cast<void*>(data_of(buffer)),
                      to_count(std::ranges::size(buffer), "allreduce"), datatype_of<T>(),
                      native_op<T>(op), c.native());
}

template <class S, class R>
auto gather_args(const communicator& c, const S& send, R& recv, int root) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(send);
    require(c.rank() != root || std::ranges::size(recv) == n * c.size(), "gather",
            "the root's receive buffer must hold size() send buffers");
    const int count = to_count(n, "gather");
    return std::tuple(static_cast<const void*>(data_of(send)), count, datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), count, datatype_of<T>(), root, c.native());
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
                      to_count(std::ranges::size(send), "gatherv"), datatype_of<T>(),
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
    const int count = to_count(n, "scatter");
    return std::tuple(static_cast<const void*>(data_of(send)), count, datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), count, datatype_of<T>(), root, c.native());
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
        to_count(std::ranges::size(recv), "scatterv"), datatype_of<T>(), root, c.native());
}

template <class S, class R>
auto allgather_args(const communicator& c, const S& send, R& recv) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    const auto n = std::ranges::size(send);
    require(std::ranges::size(recv) == n * c.size(), "allgather",
            "the receive buffer must hold size() send buffers");
    const int count = to_count(n, "allgather");
    return std::tuple(static_cast<const void*>(data_of(send)), count, datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), count, datatype_of<T>(), c.native());
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
                      to_count(std::ranges::size(send), "allgatherv"), datatype_of<T>(),
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
    const int count = to_count(n / std::size_t(c.size()), "alltoall");
    return std::tuple(static_cast<const void*>(data_of(send)), count, datatype_of<T>(),
                      static_cast<void*>(data_of(recv)), count, datatype_of<T>(), c.native());
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
                         reduce_op op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(summable<T>, "xshard: reductions need an arithmetic or complex element type");
    require(counts.size() == std::size_t(c.size()), "reduce_scatter",
            "counts need one entry per rank");
    require(std::size_t(counts[std::size_t(c.rank())]) == std::ranges::size(recv), "reduce_scatter",
            "this rank's count must equal its receive buffer's size");
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      counts.data(), datatype_of<T>(), native_op<T>(op), c.native());
}

template <class S, class R>
auto reduce_scatter_block_args(const communicator& c, const S& send, R& recv, reduce_op op) {
    require_same_type<S, R>();
    using T = buffer_value_t<S>;
    static_assert(summable<T>, "xshard: reductions need an arithmetic or complex element type");
    const auto n = std::ranges::size(recv);
    require(std::ranges::size(send) == n * c.size(), "reduce_scatter_block",
            "the send buffer must hold size() receive buffers");
    return std::tuple(static_cast<const void*>(data_of(send)), static_cast<void*>(data_of(recv)),
                      to_count(n, "reduce_scatter_block"), datatype_of<T>(), native_op<T>(op),
                      c.native());
}

template <class B>
auto send_args(const communicator& c, const B& buffer, int dest, int tag) {
    using T = buffer_value_t<B>;
    return std::tuple(static_cast<const void*>(data_of(buffer)),
                      to_count(std::ranges::size(buffer), "send"), datatype_of<T>(), dest, tag,
                      c.native());
}

template <class B>
auto recv_args(const communicator& c, B& buffer, int source, int tag) {
    using T = buffer_value_t<B>;
    return std::tuple(static_cast<void*>(data_of(buffer)),
                      to_count(std::ranges::size(buffer), "recv"), datatype_of<T>(), source, tag,
                      c.native());
}

} // namespace detail

/// Wildcards for receives.
inline constexpr int any_source = MPI_ANY_SOURCE;
inline constexpr int any_tag = MPI_ANY_TAG;

/// Blocks until every rank of `c` has called it.
inline void barrier(const communicator& c) {
    detail::run(MPI_Barrier, "MPI_Barrier", detail::barrier_args(c));
}
inline request ibarrier(const communicator& c) {
    return detail::start(MPI_Ibarrier, "MPI_Ibarrier", detail::barrier_args(c));
}

/// Copies `root`'s buffer into every rank's buffer (same size everywhere).
template <class B>
requires output_buffer<B&>
void bcast(const communicator& c, B&& buffer, int root) {
    detail::run(MPI_Bcast, "MPI_Bcast", detail::bcast_args(c, buffer, root));
}
template <class B>
requires output_buffer<B&> request ibcast(const communicator& c, B&& buffer, int root) {
    return detail::start(MPI_Ibcast, "MPI_Ibcast", detail::bcast_args(c, buffer, root));
}

/// Element-wise reduction of every rank's `send` into `recv` at `root` (recv is ignored
/// elsewhere and may be empty there).
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void reduce(const communicator& c, const S& send, R&& recv, reduce_op op, int root) {
    detail::run(MPI_Reduce, "MPI_Reduce", detail::reduce_args(c, send, recv, op, root));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce(const communicator& c, const S& send, R&& recv,
                                           reduce_op op, int root) {
    return detail::start(MPI_Ireduce, "MPI_Ireduce", detail::reduce_args(c, send, recv, op, root));
}

/// Element-wise reduction of every rank's `send` into every rank's `recv`.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void allreduce(const communicator& c, const S& send, R&& recv, reduce_op op) {
    detail::run(MPI_Allreduce, "MPI_Allreduce", detail::allreduce_args(c, send, recv, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request iallreduce(const communicator& c, const S& send, R&& recv,
                                              reduce_op op) {
    return detail::start(MPI_Iallreduce, "MPI_Iallreduce",
                         detail::allreduce_args(c, send, recv, op));
}

/// In-place all-reduce: every rank's `buffer` becomes the reduction of all of them.
template <class B>
requires output_buffer<B&>
void allreduce(const communicator& c, B&& buffer, reduce_op op) {
    detail::run(MPI_Allreduce, "MPI_Allreduce", detail::allreduce_in_place_args(c, buffer, op));
}
template <class B>
requires output_buffer<B&> request iallreduce(const communicator& c, B&& buffer, reduce_op op) {
    return detail::start(MPI_Iallreduce, "MPI_Iallreduce",
                         detail::allreduce_in_place_args(c, buffer, op));
}

/// Concatenates every rank's `send` (equal sizes) into `recv` at `root`, in rank order.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void gather(const communicator& c, const S& send, R&& recv, int root) {
    detail::run(MPI_Gather, "MPI_Gather", detail::gather_args(c, send, recv, root));
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
    detail::run(MPI_Gatherv, "MPI_Gatherv",
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
    detail::run(MPI_Scatter, "MPI_Scatter", detail::scatter_args(c, send, recv, root));
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
    detail::run(MPI_Scatterv, "MPI_Scatterv",
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
    detail::run(MPI_Allgather, "MPI_Allgather", detail::allgather_args(c, send, recv));
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
    detail::run(MPI_Allgatherv, "MPI_Allgatherv",
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
    detail::run(MPI_Alltoall, "MPI_Alltoall", detail::alltoall_args(c, send, recv));
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
    detail::run(
        MPI_Alltoallv, "MPI_Alltoallv",
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
                    reduce_op op) {
    detail::run(MPI_Reduce_scatter, "MPI_Reduce_scatter",
                detail::reduce_scatter_args(c, send, recv, counts, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce_scatter(const communicator& c, const S& send, R&& recv,
                                                   counts_view counts, reduce_op op) {
    return detail::start(MPI_Ireduce_scatter, "MPI_Ireduce_scatter",
                         detail::reduce_scatter_args(c, send, recv, counts, op));
}

/// Reduce-scatter with equal pieces of `recv.size()` elements.
template <contiguous_buffer S, class R>
requires output_buffer<R&>
void reduce_scatter_block(const communicator& c, const S& send, R&& recv, reduce_op op) {
    detail::run(MPI_Reduce_scatter_block, "MPI_Reduce_scatter_block",
                detail::reduce_scatter_block_args(c, send, recv, op));
}
template <contiguous_buffer S, class R>
requires output_buffer<R&> request ireduce_scatter_block(const communicator& c, const S& send,
                                                         R&& recv, reduce_op op) {
    return detail::start(MPI_Ireduce_scatter_block, "MPI_Ireduce_scatter_block",
                         detail::reduce_scatter_block_args(c, send, recv, op));
}

/// Sends `buffer` to rank `dest`.
template <contiguous_buffer B>
void send(const communicator& c, const B& buffer, int dest, int tag = 0) {
    detail::run(MPI_Send, "MPI_Send", detail::send_args(c, buffer, dest, tag));
}
template <contiguous_buffer B>
request isend(const communicator& c, const B& buffer, int dest, int tag = 0) {
    return detail::start(MPI_Isend, "MPI_Isend", detail::send_args(c, buffer, dest, tag));
}

/// Receives exactly `buffer.size()` elements from rank `source`.
template <class B>
requires output_buffer<B&>
void recv(const communicator& c, B&& buffer, int source, int tag = 0) {
    detail::run([](auto... a) { return MPI_Recv(a..., MPI_STATUS_IGNORE); }, "MPI_Recv",
                detail::recv_args(c, buffer, source, tag));
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
    detail::check_mpi(MPI_Sendrecv(std::get<0>(out), std::get<1>(out), std::get<2>(out), dest, tag,
                                   std::get<0>(in), std::get<1>(in), std::get<2>(in), source, tag,
                                   c.native(), MPI_STATUS_IGNORE),
                      "MPI_Sendrecv");
}

} // namespace xshard
