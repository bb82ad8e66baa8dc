#pragma once
/// \file
/// The definitions of what comm/communicator.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/communicator.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL int broken_key() {
    static const int key = [] {
        int k = MPI_KEYVAL_INVALID;
        check_mpi(
            MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &k, nullptr),
            "MPI_Comm_create_keyval");
        return k;
    }();
    return key;
}

XSHARD_DECL bool is_broken(MPI_Comm comm) {
    void* value = nullptr;
    int found = 0;
    check_mpi(MPI_Comm_get_attr(comm, broken_key(), &value, &found), "MPI_Comm_get_attr");
    return found != 0;
}

} // namespace detail

} // namespace xshard

