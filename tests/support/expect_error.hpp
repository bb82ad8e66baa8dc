#pragma once
// The tests' check of an error message: one helper for every test program.

#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <gtest/gtest.h>

#include <string>

namespace xshard::testing {

/// Runs `f` and expects an xshard::error whose message contains `part` (a failure names
/// this rank).
template <class F>
void expect_error(F&& f, const std::string& part) {
    const int rank = communicator::world().rank();
    try {
        f();
        ADD_FAILURE() << "no error; expected one saying \"" << part << "\" on rank " << rank;
    } catch (const xshard::error& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "the message \"" << e.what() << "\" lacks \"" << part << "\" on rank " << rank;
    }
}

} // namespace xshard::testing
