#include <xshard/core/mesh.hpp>
// Must not compile: "dp" names two axes.
int f(const xshard::mesh<"dp", "mp", "dp">& m) {
    return m.size();
}
