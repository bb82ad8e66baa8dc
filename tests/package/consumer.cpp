// A program that uses xshard the way a user would: include, mesh, a collective. It prints
// the headers' version; installed, it also checks that find_package(xshard) reports the same.
#include <xshard/xshard.hpp>

#include <iostream>
#include <string_view>
#include <vector>

#ifdef XSHARD_PACKAGE_VERSION
static_assert(std::string_view(XSHARD_VERSION_STRING) == XSHARD_PACKAGE_VERSION,
              "find_package(xshard) reports another version than xshard/version.hpp");
#endif

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const xshard::mesh<"dp"> mesh({xshard::auto_size});
    std::vector<int> ones(3, 1);
    xshard::mpi::allreduce(mesh.comm(), ones, xshard::reduction::sum);
    if (ones != std::vector<int>(3, mesh.size()))
        return 1;
    if (mesh.rank() == 0)
        std::cout << "consumer ok on " << mesh.size() << " ranks, xshard " << XSHARD_VERSION_STRING
                  << "\n";
    return 0;
}
