// A device mesh and its sub-communicators: a dot product of two vectors split over every
// rank of a dp x mp mesh, reduced first within each mp group, then across dp.
//
//   mpirun -n 4 build/examples/hello_mesh
#include <xshard/core.hpp>

#include <cstdio>
#include <vector>

/// The example itself; main reports its errors.
int run() {
    // mp = 2 when the world size is even; dp takes the rest.
    const int world = xshard::communicator::world().size();
    const xshard::mesh<"dp", "mp"> mesh({xshard::auto_size, world % 2 == 0 ? 2 : 1});
    if (mesh.rank() == 0)
        std::printf("%s", mesh.draw().c_str());

    // x[i] = i, y[i] = 2 for i < n; each rank owns a contiguous block of n / size.
    const long n = 1000 * mesh.size();
    const long block = n / mesh.size();
    std::vector<double> x(static_cast<std::size_t>(block)), y(x.size(), 2.0);
    for (long i = 0; i < block; ++i)
        x[std::size_t(i)] = double(mesh.rank() * block + i);
    double local = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
        local += x[i] * y[i];

    std::vector<double> partial{local};
    xshard::mpi::allreduce(mesh.sub<"mp">(), partial, xshard::reduction::sum); // within mp
    xshard::mpi::allreduce(mesh.sub<"dp">(), partial, xshard::reduction::sum); // across dp
    const double expected = double(n) * double(n - 1);                    // 2 * sum(0..n-1)
    if (mesh.rank() == 0)
        std::printf("dot(x, y) = %.0f over %d ranks (expected %.0f): %s\n", partial[0], mesh.size(),
                    expected, partial[0] == expected ? "ok" : "WRONG");
    return partial[0] == expected ? 0 : 1;
}

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    return xshard::report_errors([&] { return run(); });
}
