#pragma once
/// \file
/// xshard's exception types and the check that turns an MPI return code into one.

#include <xshard/compiled.hpp>

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace xshard {

/// Base of every exception xshard throws. Errors that every rank can detect from data
/// every rank holds are raised on every rank alike, so a misuse never leaves some ranks
/// waiting in a collective.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A file that cannot be read or written as asked (missing, truncated, corrupted, not matching
/// the model, a failed write): checkpoints, strategy files, MPI-IO. The message names the path.
class io_error : public error {
public:
    using error::error;
};

/// Raised on a rank whose collective a failure on another rank abandoned: that rank failed
/// inside a failure scope (`agreed`, `shard()`, the driver's step, a pipeline step) and told
/// every member of the scope's communicator before it unwound, so no rank waits for it for
/// ever. Carries the failing rank (in MPI_COMM_WORLD) and its message. Communicators that
/// existed when a collective was abandoned are broken afterwards (see comm/watch.hpp).
class peer_failure : public error {
public:
    peer_failure(int rank, std::string message);

    /// The rank, in MPI_COMM_WORLD, that failed first.
    int rank() const noexcept { return rank_; }
    /// Its own message.
    const std::string& message() const noexcept { return message_; }

private:
    int rank_;
    std::string message_;
};

/// Raised when a collective has not completed within the watchdog's timeout
/// (`watch_settings::timeout`). The message names the collective, the communicator's ranks and
/// the ranks that did not report waiting in it.
class collective_timeout : public error {
public:
    using error::error;
};

/// An MPI call returned an error code. Carries the code, the MPI error string, the name
/// of the operation and the rank (in MPI_COMM_WORLD) that saw it.
class mpi_error : public error {
public:
    mpi_error(int code, std::string_view operation, int rank)
        : error(describe(code, operation, rank))
        , code_(code)
        , operation_(operation)
        , rank_(rank) {}

    /// The MPI error code (MPI_ERR_*).
    int code() const noexcept { return code_; }
    /// The MPI function or xshard operation that failed, e.g. "MPI_Allgather".
    const std::string& operation() const noexcept { return operation_; }
    /// The rank in MPI_COMM_WORLD that raised the error (-1 if MPI is not running).
    int rank() const noexcept { return rank_; }

    /// The MPI error string of `code`, e.g. "MPI_ERR_RANK: invalid rank".
    static std::string error_string(int code) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
            return "unknown MPI error " + std::to_string(code);
        return std::string(text, static_cast<std::size_t>(length));
    }

private:
    static std::string describe(int code, std::string_view operation, int rank) {
        std::string message = "xshard: ";
        message.append(operation);
        message += " failed on rank " + std::to_string(rank) + ": " + error_string(code);
        return message;
    }

    int code_;
    std::string operation_;
    int rank_;
};

namespace detail {

/// This process's rank in MPI_COMM_WORLD, or -1 when MPI is not running.
XSHARD_DECL int world_rank() noexcept;

/// Throws mpi_error when `code` is not MPI_SUCCESS. Communicators xshard creates return
/// errors (MPI_ERRORS_RETURN) instead of aborting, so this check sees them.
inline void check_mpi(int code, std::string_view operation) {
    if (code != MPI_SUCCESS)
        throw mpi_error(code, operation, world_rank());
}

} // namespace detail
} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/error.ipp>
#endif
