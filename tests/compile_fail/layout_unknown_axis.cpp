#include <xshard/tensor/dtensor.hpp>
// Must not compile: the mesh has no axis tp.
using bad = xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[tp, -]">;
bad::shape_type f();
