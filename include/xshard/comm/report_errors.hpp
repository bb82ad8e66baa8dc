#pragma once
/// \file
/// A program's `main` around xshard: errors reported in one line instead of std::terminate.

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <concepts>
#include <cstdio>

namespace xshard {

/// Runs `program()` and returns its exit code; an `xshard::error` it throws is printed on
/// one line to stderr by rank 0 of MPI_COMM_WORLD and gives exit code 1. xshard raises its
/// errors on every rank alike, so rank 0 has the message; other exceptions propagate.
/// Call it inside the scope of an `environment`:
///
///     int main(int argc, char** argv) {
///         xshard::environment env(argc, argv);
///         return xshard::report_errors([&] { return run(argc, argv); });
///     }
template <class F>
    requires std::invocable<F&> && std::convertible_to<std::invoke_result_t<F&>, int>
int report_errors(F&& program) {
    try {
        return program();
    } catch (const error& e) {
        if (communicator::world().rank() == 0)
            std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}

} // namespace xshard
