#pragma once
/// \file
/// The table of primitives, by name: every operation a program can hold (tracing reads its
/// rules, execution its kernels).

#include <xshard/comm/error.hpp>
#include <xshard/compiled.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/conv.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/graph/primitives/embedding.hpp>
#include <xshard/graph/primitives/matmul.hpp>
#include <xshard/graph/primitives/normalize.hpp>
#include <xshard/graph/primitives/reduce.hpp>
#include <xshard/graph/primitives/shape.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace xshard::detail {

/// Every primitive with its kernels for element type T.
template <class T>
const std::vector<primitive<T>>& primitive_table() {
    static const std::vector<primitive<T>> table = [] {
        std::vector<primitive<T>> t;
        auto add = [&](primitive<T> p) { t.push_back(p); };
        register_elementwise<T>(add);
        register_matmul<T>(add);
        register_reduce<T>(add);
        register_normalize<T>(add);
        register_shape<T>(add);
        register_conv<T>(add);
        register_embedding<T>(add);
        return t;
    }();
    return table;
}

/// The primitive named `name` for element type T; throws xshard::error for an unknown name.
template <class T>
const primitive<T>& primitive_named(std::string_view name) {
    for (const auto& p : primitive_table<T>())
        if (p.rules->name == name)
            return p;
    throw error("xshard: no primitive is named '" + std::string(name) + "'");
}

/// The rules of the primitive named `name` (element-type free).
inline const op_rules& rules_named(std::string_view name) {
    return *primitive_named<double>(name).rules;
}

} // namespace xshard::detail

#ifdef XSHARD_SEPARATE_COMPILATION
// The table, and so every kernel it holds, is compiled once for float and double.
namespace xshard::detail {
#define XSHARD_DETAIL_PRIMITIVES(T)                                                                \
    XSHARD_INSTANTIATE const std::vector<primitive<T>>& primitive_table<T>();                      \
    XSHARD_INSTANTIATE const primitive<T>& primitive_named<T>(std::string_view);
XSHARD_DETAIL_PRIMITIVES(float)
XSHARD_DETAIL_PRIMITIVES(double)
#undef XSHARD_DETAIL_PRIMITIVES
} // namespace xshard::detail
#endif
