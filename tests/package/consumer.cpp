// A program that uses xshard the way a user would: include, mesh, a collective.
#include <xshard/xshard.hpp>

#include <iostream>
#include <vector>

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const xshard::mesh<"dp"> mesh({xshard::auto_size});
    std::vector<int> ones(3, 1);
    xshard::mpi::allreduce(mesh.comm(), ones, xshard::reduction::sum);
    if (ones != std::vector<int>(3, mesh.size()))
        return 1;
    if (mesh.rank() == 0)
        std::cout << "consumer ok on " << mesh.size() << " ranks\n";
    return 0;
}
