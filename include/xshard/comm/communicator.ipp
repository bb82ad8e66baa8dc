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

namespace xshard {

namespace mpi {

XSHARD_DECL communicator::communicator(MPI_Comm comm, bool owned) : comm_(comm) {
    if (comm == MPI_COMM_NULL)
        return;
    if (owned) {
        owner_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(comm), freer{});
        detail::owned_communicators().insert(comm);
        detail::check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                          "MPI_Comm_set_errhandler");
    }
    detail::check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
}

} // namespace mpi
} // namespace xshard
