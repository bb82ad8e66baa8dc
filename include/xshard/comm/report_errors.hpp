#pragma once
/// \file
/// A program's `main` around xshard: errors reported in one line instead of std::terminate,
/// and a job that ends whether one rank or every rank failed.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <chrono>
#include <concepts>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

namespace xshard {

/// How long `report_errors` waits by default for the other ranks to fail too before it ends
/// the job.
inline constexpr std::chrono::seconds failure_agreement_timeout{10};

/// Runs `program()` and returns its exit code. An exception it throws (`xshard::error` or any
/// other `std::exception`) is printed on one line to stderr and ends the program with exit
/// code 1:
/// - raised on every rank (xshard's errors are: an error one rank sees is agreed on before
///   the next collective, and a failure inside a failure scope ends the others' waits; see
///   comm/agree.hpp): rank 0 of MPI_COMM_WORLD prints it, and every rank returns 1;
/// - raised on some ranks only (a program's own error on one rank outside any failure scope,
///   say): the others would wait in their next collective until the watchdog's timeout, so
///   each rank that raised prints its message after its rank, and the job is aborted
///   (MPI_Abort with code 1).
/// Which it is, a barrier of the ranks that raised tells, on a communicator of the call's
/// own, waited for up to `agreement` (`failure_agreement_timeout` by default: long enough for
/// ranks that raise together but reach the barrier apart, on a loaded node). Collective over
/// MPI_COMM_WORLD (one MPI_Comm_dup); call it inside the scope of an `environment`, on every
/// rank:
///
///     int main(int argc, char** argv) {
///         xshard::environment env(argc, argv);
///         return xshard::report_errors([&] { return run(argc, argv); });
///     }
template <class F>
    requires std::invocable<F&> && std::convertible_to<std::invoke_result_t<F&>, int>
int report_errors(F&& program,
                  std::chrono::milliseconds agreement = failure_agreement_timeout) {
    const auto world = communicator::world();
    const auto failures = world.dup(); // the barrier below meets no collective of the program
    std::string message;
    try {
        return program();
    } catch (const std::exception& e) {
        message = e.what();
    } catch (...) {
        message = "an exception that is not a std::exception";
    }
    // MPI's own barrier: a failure may have marked `failures` broken with the others, but it
    // never carried an operation that could meet this one.
    MPI_Request all = MPI_REQUEST_NULL;
    int done = 0;
    if (MPI_Ibarrier(failures.native(), &all) != MPI_SUCCESS)
        all = MPI_REQUEST_NULL;
    const auto until = std::chrono::steady_clock::now() + agreement;
    while (all != MPI_REQUEST_NULL && !done && std::chrono::steady_clock::now() < until) {
        MPI_Test(&all, &done, MPI_STATUS_IGNORE);
        if (!done)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done) {
        if (world.rank() == 0)
            std::fprintf(stderr, "%s\n", message.c_str());
        return 1;
    }
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), message.c_str());
    std::fflush(stderr);
    MPI_Abort(world.native(), 1);
    return 1; // (MPI_Abort does not return)
}

} // namespace xshard
