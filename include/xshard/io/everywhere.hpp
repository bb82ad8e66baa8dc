#pragma once
/// \file
/// File-system work whose failure on one rank raises on every rank: how the collective saves
/// and loads, and the files rank 0 writes for every rank, keep the ranks in step when a file
/// operation fails on some of them (comm/agree.hpp's `agreed`, with every failure an
/// io_error).

#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <exception>
#include <string>
#include <utility>

namespace xshard::detail {

/// `f()` on every rank of `c`, its failure raised on every rank (agreed, comm/agree.hpp): a
/// failing rank rethrows its own xshard::error (any other exception becomes an io_error),
/// the others throw io_error naming it. Collective (one all-reduce of an int).
template <class F>
void everywhere(const communicator& c, F&& f) {
    agreed<io_error>(c, [&] {
        try {
            f();
        } catch (const error&) {
            throw;
        } catch (const std::exception& e) {
            throw io_error(std::string("xshard: ") + e.what());
        }
    });
}

/// `f()` on rank 0 of `c`, its failure raised on every rank (see everywhere).
template <class F>
void on_rank0(const communicator& c, F&& f) {
    everywhere(c, [&] {
        if (c.rank() == 0)
            f();
    });
}

} // namespace xshard::detail
