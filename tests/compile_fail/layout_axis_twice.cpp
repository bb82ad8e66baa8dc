#include <xshard/tensor/dtensor.hpp>
// Must not compile: dp splits both dimensions.
using bad = xshard::dtensor<double, xshard::mesh<"dp", "mp">, "[dp, dp]">;
bad::shape_type f();
