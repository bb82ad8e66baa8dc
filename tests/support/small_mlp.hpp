#pragma once
// The small tensor-parallel MLP that the training tests (hsdp, auto_parallel) run for a few
// steps and compare with one rank: column-parallel linear -> gelu -> row-parallel linear on a
// (dp, tp) mesh.

#include <xshard/core/mesh.hpp>
#include <xshard/nn/activation.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/nn/linear.hpp>

#include <cstddef>
#include <utility>

namespace xshard::testing {

using mlp_mesh = xshard::mesh<"dp", "tp">;

inline constexpr std::size_t mlp_features = 12, mlp_hidden = 16, mlp_rows = 24;

/// features -> hidden -> features, seeds 1 and 2.
inline auto small_mlp(const mlp_mesh& m) {
    using nn::column_parallel_linear, nn::gelu_activation, nn::row_parallel_linear;
    return nn::sequential(column_parallel_linear<double, mlp_mesh>(m, mlp_features, mlp_hidden, 1),
                          gelu_activation<double, mlp_mesh>(m),
                          row_parallel_linear<double, mlp_mesh>(m, mlp_hidden, mlp_features, 2));
}

using small_mlp_type = decltype(small_mlp(std::declval<const mlp_mesh&>()));

} // namespace xshard::testing
