// The counting side of traffic.hpp: MPI's profiling interface. These definitions take the
// place of Open MPI's (weak) MPI_Isend and MPI_Send in the test program; each counts the
// bytes (count times the datatype's size, which is what travels) per destination world rank
// and calls the real PMPI_ function.

#include "traffic.hpp"

#include <mpi.h>

#include <numeric>

namespace xshard::testing::traffic {
namespace {

std::vector<unsigned long long>& counts() {
    static std::vector<unsigned long long> c;
    return c;
}

void record(int count, MPI_Datatype type, int dest, MPI_Comm comm) {
    if (dest == MPI_PROC_NULL || count <= 0)
        return;
    // An invalid destination (a test of MPI's error reporting) is MPI's to reject.
    int members = 0;
    if (PMPI_Comm_size(comm, &members) != MPI_SUCCESS || dest < 0 || dest >= members)
        return;
    int size = 0;
    PMPI_Type_size(type, &size);
    MPI_Group group, world;
    PMPI_Comm_group(comm, &group);
    PMPI_Comm_group(MPI_COMM_WORLD, &world);
    int to = MPI_UNDEFINED;
    PMPI_Group_translate_ranks(group, 1, &dest, world, &to);
    PMPI_Group_free(&group);
    PMPI_Group_free(&world);
    if (to == MPI_UNDEFINED)
        return;
    auto& c = counts();
    if (c.size() <= std::size_t(to))
        c.resize(std::size_t(to) + 1);
    c[std::size_t(to)] += (unsigned long long)count * (unsigned long long)size;
}

} // namespace

void reset() {
    int n = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &n);
    counts().assign(std::size_t(n), 0);
}

const std::vector<unsigned long long>& sent_to() {
    return counts();
}

unsigned long long sent() {
    return std::accumulate(counts().begin(), counts().end(), 0ull);
}

} // namespace xshard::testing::traffic

extern "C" int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag,
                         MPI_Comm comm, MPI_Request* request) {
    xshard::testing::traffic::record(count, type, dest, comm);
    return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

extern "C" int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag,
                        MPI_Comm comm) {
    xshard::testing::traffic::record(count, type, dest, comm);
    return PMPI_Send(buf, count, type, dest, tag, comm);
}
