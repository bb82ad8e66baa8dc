#pragma once
/// \file
/// Agreement on errors: how a fault that only some ranks see (a bad local file, a failed
/// write, a throwing user callable) still raises an exception on every rank before the next
/// collective, instead of leaving the others waiting in it. The one primitive every folder
/// above comm/ uses for this.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/watch.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// The lowest rank of `c` whose `bad` is true, or -1 when no rank's is; every rank gets the
/// same answer. Collective: one all-reduce of one int.
XSHARD_DECL int first_reporting_rank(const communicator& c, bool bad);

/// The least and the greatest of one value over the ranks of a communicator.
struct value_range {
    unsigned long long least = 0, most = 0;
    /// Whether every rank holds the same value.
    bool agrees() const noexcept { return least == most; }
};

/// The least and the greatest of each of `values` over the ranks of `c`, every rank getting
/// the same answer: how ranks check that they agree on sizes (a global shape, a dataset's
/// length) before they size collectives by them. Collective: one all-reduce (max) of 2N
/// integers, each value and its complement (whose maximum is the complement of the minimum).
template <std::size_t N>
std::array<value_range, N> value_ranges(const communicator& c,
                                        const std::array<unsigned long long, N>& values) {
    std::array<unsigned long long, 2 * N> v{};
    for (std::size_t i = 0; i < N; ++i) {
        v[i] = values[i];
        v[N + i] = ~values[i];
    }
    allreduce(c, v, reduction::max);
    std::array<value_range, N> out{};
    for (std::size_t i = 0; i < N; ++i)
        out[i] = {~v[N + i], v[i]};
    return out;
}

namespace detail {

/// Rank `first`'s `mine`, on every rank of `c` (two broadcasts: length, text).
XSHARD_DECL std::string message_from(const communicator& c, int first,
                                     const std::optional<std::string>& mine);

/// Stands for the result of a callable that returns void.
struct nothing {};

} // namespace detail

/// Raises `Error` on every rank of `c` with the message of the lowest rank that has one
/// (`mine` set), or returns on every rank when none has. Collective: one all-reduce of one
/// int, plus two broadcasts (length, text) when some rank has an error.
template <class Error = error>
void agree_on_error(const communicator& c, const std::optional<std::string>& mine) {
    const int first = first_reporting_rank(c, mine.has_value());
    if (first >= 0)
        throw Error(detail::message_from(c, first, mine));
}

/// Runs `make()` on every rank of `c` and returns, on every rank alike, whether it returned
/// everywhere (an xshard::error it throws is caught): how a resource some rank may fail to
/// make (a shared-memory window MPI refuses) turns a path off on every rank, which then
/// takes another, instead of raising. Collective: one all-reduce of one int.
template <class F>
    requires std::invocable<F&>
bool made_on_every_rank(const communicator& c, F&& make) {
    bool failed = false;
    try {
        make();
    } catch (const error&) {
        failed = true;
    }
    return first_reporting_rank(c, failed) < 0;
}

namespace detail {

/// The communicator agreements over `c` run on: a duplicate of `c` made by the first
/// agreement (collective over `c`), kept as an attribute of `c` and freed with it (for
/// MPI_COMM_WORLD, before MPI_Finalize). An agreement on `c` itself could meet a collective
/// that a peer's failure left posted there.
XSHARD_DECL MPI_Comm agreement_comm(const communicator& c);

/// What one rank's run of a failure scope came to (bits).
enum scope_outcome : char {
    scope_failed = 1,    // it threw
    scope_announced = 2, // it threw first-hand and sent its failure notice
    scope_abandoned = 4, // a wait of it gave up a collective
};

/// The outcome of a failure scope over `c` on every rank: each rank's `scope_outcome`, and
/// the failing rank everyone reports (in MPI_COMM_WORLD) with its message. Waits on the
/// agreement communicator, watched but heeding no notice (they are what it settles).
struct scope_agreement {
    std::vector<char> outcomes;
    int origin = -1;
    std::string message;
};

XSHARD_DECL scope_agreement agree_on_scope(const communicator& c, char mine, int my_origin,
                                           const std::string& my_message);

/// Opens a failure scope over `c` (see `run_scope`): raises at once when `c` is broken,
/// and makes the agreement communicator while every rank is here.
XSHARD_DECL void open_scope(const communicator& c, std::string_view what);

/// How a failure scope ends on failure, on every rank: throws, given the failing rank it
/// reports (in MPI_COMM_WORLD), its message, and this rank's own exception or null.
using scope_failure = void (*)(int origin, const std::string& message,
                               std::exception_ptr failure);

/// Closes a failure scope over `c` opened when this rank had given up `abandoned` waits: its
/// `outcome` (a rank that failed first-hand has sent its notice already, to the members of
/// its `told`: `c`, or the cell of a partition of `c`, the same cell on the members of a
/// cell), the failing rank it reports (in MPI_COMM_WORLD) with its message, its own
/// exception or null. On failure anywhere, settles the notices sent to this rank; if some
/// rank gave up a wait, marks `c` and every communicator xshard owns broken (which ones the
/// others gave up on, a rank cannot tell); and calls `fail(origin, text, failure)`, which
/// throws.
XSHARD_DECL void close_scope(const communicator& c, std::uint64_t abandoned, char outcome,
                             int origin, const std::string& message, std::exception_ptr failure,
                             scope_failure fail, const communicator& told);

/// Runs `body(state)` as a failure scope over `c` and agrees on whether it threw. A rank
/// whose body throws (other than `peer_failure`, which says another rank failed) first sends
/// its message to every other member (comm/watch.hpp), so that members waiting in a
/// collective that rank will never reach raise `peer_failure`, and then joins the agreement,
/// which runs on a communicator of its own. On failure every rank calls `fail` (see
/// `scope_failure`; the exception is null where this rank raised none or a `peer_failure`),
/// which throws; when some rank gave up a collective, every rank marks `c` broken first.
/// The type-free part of `run_agreed`, compiled once whatever the callables.
XSHARD_DECL void run_scope(const communicator& c, void (*body)(void*), void* state,
                           scope_failure fail);

/// Runs `f()` as a failure scope over `c` (`run_scope`) and returns what it returned.
/// Collective: one all-gather of one byte per rank (plus two broadcasts on failure, and the
/// first time for `c`, one MPI_Comm_dup).
template <class F>
decltype(auto) run_agreed(const communicator& c, F& f, scope_failure fail) {
    using result_t = std::invoke_result_t<F&>;
    using stored_t =
        std::conditional_t<std::is_reference_v<result_t>,
                           std::reference_wrapper<std::remove_reference_t<result_t>>, result_t>;
    [[maybe_unused]] std::optional<std::conditional_t<std::is_void_v<result_t>, nothing, stored_t>>
        result;
    auto call = [&] {
        if constexpr (std::is_void_v<result_t>)
            f();
        else
            result.emplace(f());
    };
    run_scope(c, [](void* p) { (*static_cast<decltype(call)*>(p))(); }, &call, fail);
    if constexpr (std::is_reference_v<result_t>)
        return static_cast<result_t>(result->get());
    else if constexpr (!std::is_void_v<result_t>)
        return result_t(std::move(*result)); // a prvalue: `return std::move(...)` would
                                             // deduce a reference to the local
}

/// How `agreed<Error>` ends a failed scope: a rank rethrows its own exception, the others
/// throw `Error` naming the failing rank.
template <class Error>
[[noreturn]] void raise_agreed(int origin, const std::string& text, std::exception_ptr failure) {
    if (failure)
        std::rethrow_exception(failure);
    if constexpr (std::is_same_v<Error, peer_failure>)
        throw peer_failure(origin, text);
    else
        throw Error("xshard: rank " + std::to_string(origin) + " failed: " + text);
}

/// How `agreed_alike<Error>` ends a failed scope: every rank throws the same `Error`.
template <class Error>
[[noreturn]] void raise_alike(int, const std::string& text, std::exception_ptr) {
    throw Error(text);
}

} // namespace detail

/// Runs `f()` on every rank of `c` as a failure scope and agrees on the outcome before
/// returning: when `f` throws on some ranks, each of them rethrows its own exception and
/// every other rank throws `Error` (by default `peer_failure`) naming the failing rank (in
/// MPI_COMM_WORLD) and its message; otherwise returns what `f` returned. A rank that fails
/// while others wait in a collective it will not reach ends their wait (see
/// `detail::run_scope`); `c` and the communicators xshard owns are then broken on every
/// rank (`communicator::broken()`). Collective: one all-gather of one byte per rank (plus two
/// broadcasts on failure).
template <class Error = peer_failure, class F>
requires std::invocable<F&>
decltype(auto) agreed(const communicator& c, F&& f) {
    return detail::run_agreed(c, f, &detail::raise_agreed<Error>);
}

/// `agreed`, but when `f` throws on some ranks every rank throws the same `Error` with the
/// lowest failing rank's message (for checks whose message already says what failed, and
/// callers that catch one error type). Collective as `agreed`.
template <class Error = error, class F>
    requires std::invocable<F&>
decltype(auto) agreed_alike(const communicator& c, F&& f) {
    return detail::run_agreed(c, f, &detail::raise_alike<Error>);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/agree.ipp>
#endif
