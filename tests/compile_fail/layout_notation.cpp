#include <xshard/tensor/dtensor.hpp>
// Must not compile: the layout literal is malformed (no closing bracket).
using bad = xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[dp, mp">;
bad::shape_type f();
