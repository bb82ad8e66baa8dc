#include <xshard/core/mesh.hpp>
// Must not compile: the mesh has no axis "tp".
const xshard::communicator& f(const xshard::mesh<"dp", "mp">& m) {
    return m.sub<"tp">();
}
