#pragma once
/// \file
/// Agreement on errors: how a fault that only some ranks see (a bad local file, a failed
/// write, a throwing user callable) still raises an exception on every rank before the next
/// collective, instead of leaving the others waiting in it. The one primitive every folder
/// above comm/ uses for this.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace xshard {

/// The lowest rank of `c` whose `bad` is true, or -1 when no rank's is; every rank gets the
/// same answer. Collective: one all-reduce of one int.
inline int first_reporting_rank(const communicator& c, bool bad) {
    int first = bad ? c.rank() : c.size();
    allreduce(c, std::span(&first, 1), reduction::min);
    return first == c.size() ? -1 : first;
}

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
inline std::string message_from(const communicator& c, int first,
                                const std::optional<std::string>& mine) {
    unsigned long long length = c.rank() == first ? mine->size() : 0;
    bcast(c, std::span(&length, 1), first);
    std::string text(static_cast<std::size_t>(length), '\0');
    if (c.rank() == first)
        text = *mine;
    bcast(c, std::span(text.data(), text.size()), first);
    return text;
}

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

/// Runs `f()` and agrees over `c` on whether it threw; on failure every rank calls
/// `fail(first, text, failure)` (the lowest failing rank, its message, this rank's own
/// exception or null), which throws. Failing ranks take part in sending the message too, so
/// none is left in a collective. Collective: one all-reduce of one int (plus two broadcasts
/// on failure).
template <class F, class Fail>
decltype(auto) run_agreed(const communicator& c, F& f, Fail fail) {
    using result_t = std::invoke_result_t<F&>;
    using stored_t =
        std::conditional_t<std::is_reference_v<result_t>,
                           std::reference_wrapper<std::remove_reference_t<result_t>>, result_t>;
    std::exception_ptr failure;
    std::optional<std::string> message;
    [[maybe_unused]] std::optional<std::conditional_t<std::is_void_v<result_t>, nothing, stored_t>>
        result;
    try {
        if constexpr (std::is_void_v<result_t>)
            f();
        else
            result.emplace(f());
    } catch (const std::exception& e) {
        failure = std::current_exception();
        message = e.what();
    } catch (...) {
        failure = std::current_exception();
        message = "an exception not derived from std::exception";
    }
    const int first = first_reporting_rank(c, failure != nullptr);
    if (first >= 0)
        fail(first, message_from(c, first, message), failure);
    if constexpr (std::is_reference_v<result_t>)
        return static_cast<result_t>(result->get());
    else if constexpr (!std::is_void_v<result_t>)
        return result_t(std::move(*result)); // a prvalue: `return std::move(...)` would
                                             // deduce a reference to the local
}

} // namespace detail

/// Runs `f()` on every rank of `c` and agrees on the outcome before returning: when `f`
/// throws on some ranks, each of them rethrows its own exception and every other rank
/// throws `Error` naming the lowest failing rank and its message; otherwise returns what
/// `f` returned. Collective: one all-reduce of one int (plus two broadcasts on failure).
template <class Error = error, class F>
    requires std::invocable<F&>
decltype(auto) agreed(const communicator& c, F&& f) {
    return detail::run_agreed(c, f, [](int first, const std::string& text, std::exception_ptr failure) {
        if (failure)
            std::rethrow_exception(failure);
        throw Error("xshard: rank " + std::to_string(first) + " failed: " + text);
    });
}

/// `agreed`, but when `f` throws on some ranks every rank throws the same `Error` with the
/// lowest failing rank's message (for checks whose message already says what failed, and
/// callers that catch one error type). Collective as `agreed`.
template <class Error = error, class F>
    requires std::invocable<F&>
decltype(auto) agreed_alike(const communicator& c, F&& f) {
    return detail::run_agreed(c, f, [](int, const std::string& text, std::exception_ptr) {
        throw Error(text);
    });
}

} // namespace xshard
